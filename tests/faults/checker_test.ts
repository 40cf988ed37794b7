import { throws } from "node:assert/strict";
import { assert, assertEquals } from "../_assert.ts";
import {
  type CandidateLog,
  type CandidateRecord,
  checkTerms,
  parseCandidateOutput,
} from "../../src/testing/checker.ts";

function log(name: string, records: CandidateRecord[], extra: Partial<CandidateLog> = {}) {
  return { name, records, ...extra };
}

const acquired = (t: number, token: number): CandidateRecord => ({
  type: "acquired",
  t,
  token: String(token),
});
const termEnd = (t: number, token: number): CandidateRecord => ({
  type: "term-end",
  t,
  token: String(token),
});
const lease = (t: number, token: number, until: number): CandidateRecord => ({
  type: "lease",
  t,
  token: String(token),
  until,
});
const lost = (t: number): CandidateRecord => ({ type: "lost", t, reason: "lease-expired" });

Deno.test("checkTerms() accepts terms that follow each other with increasing tokens", () => {
  const report = checkTerms([
    log("a", [acquired(100, 5), termEnd(200, 5), lost(200.5)]),
    log("b", [acquired(201, 7), termEnd(300, 7)]),
  ]);
  assertEquals(report.violations, []);
  assertEquals(report.terms.map((t) => [t.candidate, t.start, t.end]), [
    ["a", 100, 200],
    ["b", 201, 300],
  ]);
  assertEquals(report.maxOverlapMs, 0);
  assertEquals(report.minGapMs, 1);
});

Deno.test("checkTerms() reports two terms that overlap, by how much", () => {
  const report = checkTerms([
    log("a", [acquired(100, 5), termEnd(250, 5)]),
    log("b", [acquired(200, 7), termEnd(300, 7)]),
  ]);
  assertEquals(report.violations.map((v) => v.kind), ["overlap"]);
  assertEquals(report.maxOverlapMs, 50);
});

Deno.test("checkTerms() reports a token that does not increase from term to term", () => {
  const report = checkTerms([
    log("a", [acquired(100, 9), termEnd(150, 9)]),
    log("b", [acquired(200, 9), termEnd(300, 9)]),
    log("c", [acquired(400, 3), termEnd(500, 3)]),
  ]);
  assertEquals(report.violations.map((v) => v.kind), ["token-order", "token-order"]);
});

Deno.test("checkTerms() ends a term at its lease deadline when that comes before term-end", () => {
  // Frozen from 120 to 900: it printed term-end only on resume, but its lease ran out at 400.
  const report = checkTerms([
    log(
      "a",
      [acquired(100, 5), lease(100, 5, 300), lease(110, 5, 400), termEnd(901, 5), lost(902)],
      {
        freezes: [{ from: 120, to: 900 }],
        leaseMs: 300,
      },
    ),
    log("b", [acquired(450, 7), termEnd(600, 7)]),
  ]);
  assertEquals(report.violations, []);
  assertEquals(report.terms[0]?.end, 400);
  assertEquals(report.terms[0]?.endSource, "lease");
});

Deno.test("checkTerms() finds an overlap with a frozen leader whose lease had not run out", () => {
  const report = checkTerms([
    log("a", [acquired(100, 5), lease(110, 5, 500), termEnd(901, 5), lost(902)], {
      freezes: [{ from: 120, to: 900 }],
      leaseMs: 400,
    }),
    log("b", [acquired(450, 7), termEnd(600, 7)]),
  ]);
  assertEquals(report.violations.map((v) => v.kind), ["overlap"]);
  assertEquals(report.maxOverlapMs, 50);
});

Deno.test("checkTerms() ends a frozen term at the freeze without lease lines, and says so", () => {
  const report = checkTerms([
    log("a", [acquired(100, 5), termEnd(901, 5), lost(902)], {
      freezes: [{ from: 120, to: 900 }],
      leaseMs: 300,
    }),
    log("b", [acquired(450, 7), termEnd(600, 7)]),
  ]);
  assertEquals(report.violations, []);
  assertEquals(report.terms[0]?.endSource, "freeze");
  assertEquals(report.notes.length, 1);
});

Deno.test("checkTerms() reports a leader that acts as leader on resume from a freeze past its lease", () => {
  const report = checkTerms([
    log("a", [acquired(100, 5), lease(110, 5, 400), lease(901, 5, 1200), termEnd(1300, 5)], {
      freezes: [{ from: 120, to: 900 }],
      leaseMs: 300,
    }),
  ]);
  assert(report.violations.some((v) => v.kind === "acted-after-freeze"));
});

Deno.test("checkTerms() accepts a lease line printed on resume for a check answered before the freeze", () => {
  // The check sent at 110 was answered, then SIGSTOP came before its line was printed: the line
  // appears at 901 with the deadline 410, already past, and the term ends right after it.
  const stale = checkTerms([
    log("a", [acquired(100, 5), lease(100, 5, 400), lease(901, 5, 410), termEnd(902, 5)], {
      freezes: [{ from: 120, to: 900 }],
      leaseMs: 300,
    }),
    log("b", [acquired(450, 7), termEnd(600, 7)]),
  ]);
  assertEquals(stale.violations, []);
  assertEquals(stale.terms[0]?.end, 410);
  // A check sent after the resume (deadline 1201) is acting as leader.
  const fresh = checkTerms([
    log("a", [acquired(100, 5), lease(100, 5, 400), lease(901, 5, 1201), termEnd(1300, 5)], {
      freezes: [{ from: 120, to: 900 }],
      leaseMs: 300,
    }),
  ]);
  assertEquals(fresh.violations.map((v) => v.kind), ["acted-after-freeze"]);
});

Deno.test("checkTerms() ends a SIGKILLed leader's term when the signal was sent", () => {
  const report = checkTerms([
    log("a", [acquired(100, 5)], { killedAt: 150 }),
    log("b", [acquired(160, 7), termEnd(300, 7)]),
  ]);
  assertEquals(report.violations, []);
  assertEquals(report.terms[0]?.endSource, "killed");
});

Deno.test("checkTerms() reports a term that never ended while another began", () => {
  const report = checkTerms([
    log("a", [acquired(100, 5)]),
    log("b", [acquired(160, 7), termEnd(300, 7)]),
  ]);
  assertEquals(report.violations.map((v) => v.kind), ["open-term"]);
});

Deno.test("checkTerms() reports clocks that disagree between processes", () => {
  const report = checkTerms([
    log("a", [{ ...acquired(100, 5), receivedAt: 90 }, { ...termEnd(200, 5), receivedAt: 201 }]),
  ]);
  assertEquals(report.violations.map((v) => v.kind), ["clock-skew"]);
  assertEquals(report.clockSkewMs, -10);
});

const ready = (t: number): CandidateRecord => ({ type: "ready", t });
const stopped = (t: number): CandidateRecord => ({ type: "stopped", t });
const error = (t: number, message: string): CandidateRecord => ({ type: "error", t, message });

Deno.test("checkTerms() reports a candidate that stopped without being told to, with its last error", () => {
  const report = checkTerms([
    log("a", [
      ready(0),
      acquired(10, 5),
      termEnd(100, 5),
      lost(100.5),
      error(150, "pooler"),
      stopped(160),
    ]),
    log("b", [ready(5), acquired(120, 6)], { stopRequestedAt: 500 }),
  ]);
  assertEquals(report.violations.map((v) => v.kind), ["stopped-unasked"]);
  assert(report.violations[0]!.message.includes("a stopped"), report.violations[0]!.message);
  assert(report.violations[0]!.message.includes("pooler"), report.violations[0]!.message);
});

Deno.test("checkTerms() says which signal stopped a candidate the harness did not stop, and how it exited", () => {
  const report = checkTerms([
    log("a", [
      ready(0),
      { type: "signal", t: 40, signal: "SIGINT" },
      { type: "state", t: 41, from: "acquiring", to: "stopped" },
      stopped(42),
    ], { stopRequestedAt: 100, exitedAt: 43, exitStatus: "code 0" }),
  ]);
  assertEquals(report.violations.map((v) => v.kind), ["stopped-unasked"]);
  const { message } = report.violations[0]!;
  for (
    const part of [
      "seen 59.0 ms before the harness asked",
      "it received SIGINT 1.0 ms before it stopped",
      "it exited with code 0",
      "its last lines: ready, signal, state acquiring->stopped",
    ]
  ) assert(message.includes(part), message);
});

Deno.test("checkTerms() compares a stop with the harness's request on the harness's clock", () => {
  // The candidate's clock runs 2 ms behind the harness's: it printed its stop at 99.5 on its own
  // clock, after the SIGTERM sent at 100 on the harness's, which read the line at 101.6.
  const asked = checkTerms([
    log("a", [
      { ...ready(0), receivedAt: 2.2 },
      { type: "signal", t: 99.2, signal: "SIGTERM", receivedAt: 101.3 },
      { type: "state", t: 99.5, from: "acquiring", to: "stopped", receivedAt: 101.6 },
    ], { stopRequestedAt: 100 }),
  ]);
  assertEquals(asked.violations, []);
  // Read before the harness asked: unasked, though the line's own time (a clock 0.7 ms ahead)
  // comes after the request.
  const unasked = checkTerms([
    log("a", [
      { ...ready(0), receivedAt: 0.2 },
      { type: "state", t: 100.5, from: "acquiring", to: "stopped", receivedAt: 99.8 },
    ], { stopRequestedAt: 100 }),
  ]);
  assertEquals(unasked.violations.map((v) => v.kind), ["stopped-unasked"]);
});

Deno.test("checkTerms() accepts a stop the harness asked for, and a SIGKILL", () => {
  const report = checkTerms([
    log("a", [ready(0), acquired(10, 5), termEnd(100, 5), stopped(101)], { stopRequestedAt: 99 }),
    log("b", [ready(5)], { killedAt: 50, exitedAt: 52 }),
    log("c", [ready(5), acquired(101, 6), termEnd(200, 6), stopped(201)], { stopRequestedAt: 99 }),
  ]);
  assertEquals(report.violations, []);
});

Deno.test("checkTerms() reports a process that exited unasked without printing stopped", () => {
  const report = checkTerms([
    log("a", [ready(0), acquired(10, 5), termEnd(100, 5)], { exitedAt: 120 }),
  ]);
  assertEquals(report.violations.map((v) => v.kind), ["stopped-unasked"]);
});

Deno.test("checkTerms() reports a stretch without a leader longer than the bound", () => {
  // a leads 10-100, nobody 100-1000, b leads from 1000 until the harness stops everyone at 1500.
  const logs = [
    log("a", [ready(0), acquired(10, 5), termEnd(100, 5), lost(101)], { stopRequestedAt: 1500 }),
    log("b", [ready(5), acquired(1000, 6)], { stopRequestedAt: 1500 }),
  ];
  const report = checkTerms(logs, { maxLeaderlessMs: 500 });
  assertEquals(report.violations.map((v) => v.kind), ["leaderless"]);
  assertEquals(report.maxLeaderlessMs, 900);
  assert(report.violations[0]!.message.includes("900.0 ms"), report.violations[0]!.message);
  // Without a bound, the stretch is measured but not a violation.
  assertEquals(checkTerms(logs).violations, []);
  assertEquals(checkTerms(logs).maxLeaderlessMs, 900);
  // Within the bound, nothing to report.
  assertEquals(checkTerms(logs, { maxLeaderlessMs: 900 }).violations, []);
});

Deno.test("checkTerms() measures a leaderless stretch without the excused intervals", () => {
  const logs = [
    log("a", [ready(0), acquired(10, 5), termEnd(100, 5)], { stopRequestedAt: 3000 }),
    log("b", [ready(5), acquired(1900, 6)], { stopRequestedAt: 3000 }),
  ];
  // The server was down from 120 to 1500: 20 ms before it, 400 ms after it.
  const report = checkTerms(logs, { maxLeaderlessMs: 500, excused: [{ from: 120, to: 1500 }] });
  assertEquals(report.violations, []);
  assertEquals(report.maxLeaderlessMs, 400);
  // Back at 1200 instead: 700 ms after it, over the bound.
  const late = checkTerms(logs, { maxLeaderlessMs: 500, excused: [{ from: 120, to: 1200 }] });
  assertEquals(late.violations.map((v) => v.kind), ["leaderless"]);
});

Deno.test("checkTerms() reports a fleet whose last leader stopped and nobody took over", () => {
  // The trace of a pooler false verdict: every candidate stops, so the lock is never taken again.
  const report = checkTerms([
    log("a", [ready(0), acquired(10, 5), termEnd(100, 5), lost(100), stopped(130)], {
      stopRequestedAt: 5000,
    }),
    log("b", [ready(5), error(140, "pooler"), stopped(150)], { stopRequestedAt: 5000 }),
  ], { maxLeaderlessMs: 2000 });
  assertEquals(report.violations.map((v) => v.kind), [
    "stopped-unasked",
    "stopped-unasked",
    "leaderless",
  ]);
  assertEquals(report.maxLeaderlessMs, 4900);
});

Deno.test("checkTerms() refuses a negative leaderless bound", () => {
  throws(() => checkTerms([], { maxLeaderlessMs: -1 }), {
    name: "RangeError",
    message: /'maxLeaderlessMs' must be a number >= 0: current value is -1/,
  });
  throws(() => checkTerms([], { maxLeaderlessMs: NaN }), { name: "RangeError" });
});

Deno.test("parseCandidateOutput() keeps candidate records and skips other lines", () => {
  const records = parseCandidateOutput(
    [
      '{"t":1.5,"pid":3,"type":"ready"}',
      "Warning: something",
      '{"t":2,"pid":3,"type":"acquired","token":"12"}',
      "{not json",
      '{"t":"x","type":"lost"}',
      "",
    ].join("\n"),
  );
  assertEquals(records.map((r) => r.type), ["ready", "acquired"]);
});
