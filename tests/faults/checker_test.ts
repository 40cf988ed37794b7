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
