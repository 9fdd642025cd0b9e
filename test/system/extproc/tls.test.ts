/**
 * ext_proc over TLS (#24): real gateways connect to endpoint pickers over TLS. A self-signed
 * certificate made with openssl: a client trusting it routes; a cleartext client cannot talk.
 */
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { ChannelCredentials } from "@grpc/grpc-js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { destinationOf, EnvoyClient } from "../../helpers/envoy-client.js";
import { completionsBody, ids, startHarness, worker, type Harness } from "../../helpers/picker-harness.js";

let dir: string;
let h: Harness | undefined;

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "kvmesh-extproc-tls-"));
  execFileSync("openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1", "-subj", "/CN=kvmesh-test", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", join(dir, "tls.key"), "-out", join(dir, "tls.crt")], { stdio: "ignore" });
});

afterAll(async () => {
  await h?.close();
  rmSync(dir, { recursive: true, force: true });
});

describe("ext_proc over TLS", () => {
  it("serves Process and Health over TLS from the cert and key files; cleartext is refused", async () => {
    h = await startHarness({ config: { tlsCertFile: join(dir, "tls.crt"), tlsKeyFile: join(dir, "tls.key") } });
    h.svc.upsertWorker(worker(1, "http://10.0.0.1:8000", { model_name: "m" }));
    const tls = new EnvoyClient(`127.0.0.1:${h.picker.port}`, ChannelCredentials.createSsl(readFileSync(join(dir, "tls.crt"))));
    try {
      expect((await tls.check("readiness")).status).toBe("SERVING");
      const s = tls.open();
      tls.headers(s, { requestBodyMode: "BUFFERED" });
      await s.next();
      tls.body(s, completionsBody(ids(4)));
      expect(destinationOf(await s.next())).toBe("10.0.0.1:8000");
      s.cancel();
    } finally {
      tls.close();
    }
    await expect(h.client.check("readiness")).rejects.toBeDefined();
  });
});
