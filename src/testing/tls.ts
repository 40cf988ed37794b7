/**
 * Certificates for TLS tests, made with the system's `openssl`: a throwaway certificate
 * authority and server certificates it signs, ready for {@linkcode startPostgres}'s `settings`.
 *
 * @module
 */
import { join } from "node:path";
import { run, serviceUser } from "./_run.ts";

/** A server certificate and its key, as files. */
export interface ServerCertificate {
  /** The certificate (PEM). */
  readonly certFile: string;
  /** The private key (PEM), readable only by the account that runs PostgreSQL. */
  readonly keyFile: string;
  /** The names it is valid for (DNS names and IP addresses). */
  readonly hostnames: readonly string[];
}

/** Options of {@linkcode TestCertificates.issue}. */
export interface IssueOptions {
  /**
   * The DNS names and IP addresses the certificate is valid for.
   *
   * @default {["localhost", "127.0.0.1"]}
   */
  hostnames?: readonly string[];
  /**
   * Sign it with a key of its own (self-signed) instead of the test CA.
   *
   * @default {false}
   */
  selfSigned?: boolean;
}

/** A test CA from {@linkcode makeCertificates}. Disposing of it removes its files. */
export interface TestCertificates extends AsyncDisposable {
  /** The directory holding everything. */
  readonly dir: string;
  /** The CA's certificate (PEM): what clients trust, as `sslrootcert=`. */
  readonly caFile: string;
  /** The first server certificate, for `localhost` and `127.0.0.1` unless told otherwise. */
  readonly server: ServerCertificate;
  /**
   * Settings that turn TLS on with {@linkcode TestCertificates.server}, for
   * `startPostgres({ settings })`.
   */
  readonly serverSettings: Record<string, string>;
  /**
   * Makes another server certificate.
   *
   * @param options Its names, and whether to sign it with the CA.
   * @returns The files.
   */
  issue(options?: IssueOptions): Promise<ServerCertificate>;
  /**
   * Copies another certificate over the files {@linkcode TestCertificates.serverSettings} names,
   * so that a server reloading its configuration (`SELECT pg_reload_conf()`) presents it.
   *
   * @param certificate The certificate to present.
   */
  present(certificate: ServerCertificate): Promise<void>;
  /** Removes the files. Safe to call twice. */
  close(): Promise<void>;
}

/**
 * Makes a throwaway CA and a server certificate it signs, with `openssl` (elliptic-curve keys,
 * valid for two days).
 *
 * @example A server with TLS, and a client that verifies it
 * ```ts
 * import { LeaderLock } from "@x/pgleaderlock";
 * import { makeCertificates, startPostgres } from "@x/pgleaderlock/testing";
 * import assert from "node:assert/strict";
 *
 * await using certs = await makeCertificates();
 * await using server = await startPostgres({ settings: certs.serverSettings });
 * const dsn = `${server.dsn}?sslmode=verify-full&sslrootcert=${certs.caFile}`;
 * await using lock = new LeaderLock({ dsn, name: "over-tls" });
 * await lock.start();
 * assert.equal(await lock.waitForLeadership({ timeoutMs: 10_000 }), true);
 * ```
 *
 * @param options The names of the first server certificate.
 * @returns The CA and the certificate.
 * @throws {Error} When `openssl` is missing or fails.
 */
export async function makeCertificates(
  options: { hostnames?: readonly string[] } = {},
): Promise<TestCertificates> {
  const dir = await Deno.realPath(await Deno.makeTempDir({ prefix: "pgleaderlock-tls-" }));
  // PostgreSQL (running as another account when we are root) must reach the files.
  await Deno.chmod(dir, 0o755);
  const caKey = join(dir, "ca.key");
  const caFile = join(dir, "ca.pem");
  try {
    await openssl([
      "req",
      "-x509",
      ...EC_KEY,
      "-nodes",
      "-keyout",
      caKey,
      "-out",
      caFile,
      "-days",
      "2",
      "-subj",
      "/CN=pgleaderlock test CA",
      "-addext",
      "basicConstraints=critical,CA:TRUE",
      "-addext",
      "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    const certificates = new Certificates(dir, caFile, caKey);
    await certificates.init(options.hostnames ?? ["localhost", "127.0.0.1"]);
    return certificates;
  } catch (error) {
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    throw error;
  }
}

const EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

async function openssl(args: string[]): Promise<void> {
  let result;
  try {
    result = await run("openssl", args);
  } catch (error) {
    throw new Error("Cannot make test certificates: `openssl` is not installed", {
      cause: error,
    });
  }
  if (!result.success) {
    throw new Error(`openssl ${args[0]} failed (exit ${result.code}): ${result.stderr.trim()}`);
  }
}

class Certificates implements TestCertificates {
  readonly dir: string;
  readonly caFile: string;
  #caKey: string;
  #count = 0;
  #server: ServerCertificate | undefined;
  #closing: Promise<void> | undefined;

  constructor(dir: string, caFile: string, caKey: string) {
    this.dir = dir;
    this.caFile = caFile;
    this.#caKey = caKey;
  }

  async init(hostnames: readonly string[]): Promise<void> {
    const first = await this.issue({ hostnames });
    const live: ServerCertificate = {
      certFile: join(this.dir, "server.pem"),
      keyFile: join(this.dir, "server.key"),
      hostnames: first.hostnames,
    };
    this.#server = live;
    await this.present(first);
  }

  get server(): ServerCertificate {
    return this.#server!;
  }

  get serverSettings(): Record<string, string> {
    return { ssl: "on", ssl_cert_file: this.server.certFile, ssl_key_file: this.server.keyFile };
  }

  async issue(options: IssueOptions = {}): Promise<ServerCertificate> {
    const { hostnames = ["localhost", "127.0.0.1"], selfSigned = false } = options;
    if (hostnames.length === 0) {
      throw new RangeError("Cannot issue a certificate as 'hostnames' must not be empty");
    }
    const n = ++this.#count;
    const keyFile = join(this.dir, `issued-${n}.key`);
    const certFile = join(this.dir, `issued-${n}.pem`);
    const san = hostnames.map((h) => (/^[\d.]+$|:/.test(h) ? `IP:${h}` : `DNS:${h}`)).join(",");
    const subject = `/CN=${hostnames[0]}`;
    if (selfSigned) {
      await openssl([
        "req",
        "-x509",
        ...EC_KEY,
        "-nodes",
        "-keyout",
        keyFile,
        "-out",
        certFile,
        "-days",
        "2",
        "-subj",
        subject,
        "-addext",
        `subjectAltName=${san}`,
      ]);
    } else {
      const csr = join(this.dir, `issued-${n}.csr`);
      const ext = join(this.dir, `issued-${n}.ext`);
      await openssl([
        "req",
        "-new",
        ...EC_KEY,
        "-nodes",
        "-keyout",
        keyFile,
        "-out",
        csr,
        "-subj",
        subject,
      ]);
      await Deno.writeTextFile(
        ext,
        `subjectAltName=${san}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n`,
      );
      await openssl([
        "x509",
        "-req",
        "-in",
        csr,
        "-CA",
        this.caFile,
        "-CAkey",
        this.#caKey,
        "-CAcreateserial",
        "-out",
        certFile,
        "-days",
        "2",
        "-extfile",
        ext,
      ]);
    }
    return { certFile, keyFile, hostnames: [...hostnames] };
  }

  async present(certificate: ServerCertificate): Promise<void> {
    const target = this.server;
    await Deno.copyFile(certificate.certFile, target.certFile);
    await Deno.writeFile(target.keyFile, await Deno.readFile(certificate.keyFile), { mode: 0o600 });
    await Deno.chmod(target.keyFile, 0o600);
    await Deno.chmod(target.certFile, 0o644);
    // PostgreSQL wants its key owned by the account it runs as, and private.
    const user = await serviceUser();
    if (user !== null) await Deno.chown(target.keyFile, user.uid, user.gid);
  }

  close(): Promise<void> {
    this.#closing ??= Deno.remove(this.dir, { recursive: true }).catch(() => {});
    return this.#closing;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
