/**
 * The status page in a real browser: headless Chromium (Debian's `chromium`, driven by
 * puppeteer-core, which downloads no browser) against a live 2-replica mesh of `kvmesh serve`
 * processes with workers and traffic. It checks that the peers, the workers' ranks and the live
 * routing figures appear and move as traffic flows, that both replicas' pages agree, that a
 * deregistered peer leaves the page, and that with --api-token-file the page asks for the token
 * instead of showing data. A screenshot goes to reports/ui-status.png.
 *
 * Without a Chromium binary the test is skipped (with a message saying so); `.ci/run` installs
 * Debian's chromium so CI runs it. KVMESH_CHROMIUM names another binary.
 */
import { chmodSync, existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import puppeteer, { type Browser, type Page } from "puppeteer-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { spawnDaemon, stopDaemon, type DaemonProcess } from "../../helpers/daemon-process.js";
import { freePortPair } from "../../helpers/ports.js";
import { waitFor } from "../../helpers/wait.js";

const CANDIDATES = [process.env.KVMESH_CHROMIUM, "/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome-stable", "/usr/bin/google-chrome"];
const CHROMIUM = CANDIDATES.find((p): p is string => p !== undefined && p !== "" && existsSync(p));
const SKIP_REASON = `no Chromium binary (looked for ${CANDIDATES.filter((p) => p !== undefined && p !== "").join(", ")}): install Debian's chromium (apt-get install chromium) or set KVMESH_CHROMIUM`;
if (CHROMIUM === undefined) console.warn(`test/http/ui-browser.test.ts skipped: ${SKIP_REASON}`);

const SCREENSHOT = "reports/ui-status.png";
const TOKEN = "bR0wS3rT0k3nXq7Lm2Np9Vz4Kc8Hd1Fg";
/** The page polls once a second; a slow shared CI box gets a few polls' slack. */
const PAGE_WAIT_MS = 15_000;

/** What the page shows, read from its DOM (by id and data- attributes, not by layout). */
interface PageView {
  readonly authShown: boolean;
  readonly dataShown: boolean;
  readonly authError: string;
  readonly replicaId: string;
  readonly answeredBy: string;
  readonly peers: readonly { readonly endpoint: string; readonly state: string }[];
  readonly ranks: readonly { readonly worker: string; readonly rank: string; readonly blocksFill: number }[];
  readonly rankSummary: string;
  readonly selTotal: number;
  readonly selRate: number;
  readonly bindingsLive: number;
  readonly bodyText: string;
}

const VIEW_SCRIPT = `(() => {
  const t = (id) => document.getElementById(id)?.textContent ?? "";
  const num = (id) => Number(t(id).replace(/,/g, "")) || 0;
  return {
    authShown: !document.getElementById("auth").hidden,
    dataShown: !document.getElementById("data").hidden,
    authError: t("auth-error"),
    replicaId: t("replica-id"),
    answeredBy: t("answered"),
    peers: [...document.querySelectorAll("#peers tbody tr")].map((tr) => ({ endpoint: tr.dataset.endpoint, state: tr.querySelector(".badge")?.textContent ?? "" })),
    ranks: [...document.querySelectorAll("#ranks .rank")].map((d) => ({ worker: d.dataset.worker, rank: d.dataset.rank, blocksFill: parseFloat(d.querySelector(".bar.blocks .fill")?.style.width ?? "0") })),
    rankSummary: t("rank-summary"),
    selTotal: num("sel-total"),
    selRate: num("sel-rate"),
    bindingsLive: num("bind-live"),
    bodyText: document.body.innerText,
  };
})()`;

const view = async (page: Page): Promise<PageView> => (await page.evaluate(VIEW_SCRIPT)) as PageView;

/** Waits until the page's view satisfies `ok`; the failure shows the last view. */
async function waitForView(page: Page, ok: (v: PageView) => boolean, what: string): Promise<PageView> {
  let last: PageView | undefined;
  await waitFor(
    async () => {
      last = await view(page);
      return ok(last);
    },
    PAGE_WAIT_MS,
    () => `${what}; last view: ${JSON.stringify({ ...last, bodyText: undefined })}`,
  );
  return last as PageView;
}

async function post(base: string, path: string, body: unknown): Promise<{ status: number; json: Record<string, unknown> }> {
  const r = await fetch(`${base}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: r.status, json: (await r.json()) as Record<string, unknown> };
}
const getJson = async <T>(base: string, path: string): Promise<T> => (await fetch(`${base}${path}`)).json() as Promise<T>;
const prompt = (blocks: number, seed: number): number[] => Array.from({ length: blocks * 16 }, (_, i) => seed * 100_000 + i);

describe.skipIf(CHROMIUM === undefined)(`the status page in headless Chromium${CHROMIUM === undefined ? ` (skipped: ${SKIP_REASON})` : ""}`, () => {
  const procs: DaemonProcess[] = [];
  let browser: Browser;
  let dir = "";

  beforeAll(async () => {
    browser = await puppeteer.launch({
      executablePath: CHROMIUM as string,
      headless: true,
      // Root in CI containers has no user namespaces for the sandbox; /dev/shm is small there.
      args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check"],
    });
    dir = mkdtempSync(join(tmpdir(), "kvmesh-ui-browser-"));
  }, 60_000);
  afterAll(async () => {
    await browser.close();
    await Promise.all(procs.splice(0).map((p) => stopDaemon(p)));
    rmSync(dir, { recursive: true, force: true });
  });

  it("shows both replicas' peers, ranks and live routing figures as traffic flows, and drops a deregistered peer", async () => {
    const [pa, pb] = [await freePortPair(), await freePortPair()];
    const common = ["--no-kv-events", "--session-affinity-ttl-secs", "600", "--session-affinity-mode", "soft"];
    const a = await spawnDaemon([...common, "--replica-sync-port", String(pa)]);
    procs.push(a);
    const b = await spawnDaemon([...common, "--replica-sync-port", String(pb), "--peers", `tcp://127.0.0.1:${String(pa)}`]);
    procs.push(b);
    for (const d of [a, b]) {
      for (const id of [1, 2, 3, 4]) {
        const r = await post(d.url, "/workers", { worker_id: id, endpoint: `http://w${String(id)}`, block_size: 16, total_kv_blocks: 256, data_parallel_size: 2 });
        expect(r.status).toBe(201);
      }
    }
    await waitFor(async () => (await getJson<string[]>(a.url, "/replica_sync/peers")).length === 1 && (await getJson<string[]>(b.url, "/replica_sync/peers")).length === 1, 10_000, "the replicas to peer");
    const [aPeer] = await getJson<string[]>(b.url, "/replica_sync/peers");
    const [bPeer] = await getJson<string[]>(a.url, "/replica_sync/peers");
    const idOf = async (d: DaemonProcess): Promise<string> => (await getJson<{ replica: { id: string } }>(d.url, "/ui/state")).replica.id;
    const [aId, bId] = [await idOf(a), await idOf(b)];
    expect(aId).not.toBe(bId);

    const pageA = await browser.newPage();
    const pageB = await browser.newPage();
    const errors: string[] = [];
    for (const p of [pageA, pageB]) {
      p.on("pageerror", (e) => errors.push(String(e)));
      p.on("console", (m) => {
        if (m.type() === "error") errors.push(m.text());
      });
      await p.setViewport({ width: 1280, height: 1000 });
    }
    // GET / redirects to /ui.
    await pageA.goto(`${a.url}/`, { waitUntil: "domcontentloaded" });
    expect(pageA.url()).toBe(`${a.url}/ui`);
    await pageB.goto(`${b.url}/ui`, { waitUntil: "domcontentloaded" });

    // Each page says which replica answered, and lists the other as an alive peer, with 8 idle ranks.
    const idleA = await waitForView(pageA, (v) => v.replicaId === aId && v.peers.length === 1 && v.peers[0]?.state === "alive" && v.ranks.length === 8, "page A: its id, one alive peer, 8 ranks");
    expect(idleA.peers[0]?.endpoint).toBe(bPeer);
    expect(idleA.answeredBy).toContain(aId);
    expect(idleA.selTotal).toBe(0);
    expect(idleA.rankSummary).toContain("8 ranks");
    expect(idleA.rankSummary).toContain("0 requests");
    const idleB = await waitForView(pageB, (v) => v.replicaId === bId && v.peers.length === 1 && v.peers[0]?.state === "alive", "page B: its id and one alive peer");
    expect(idleB.peers[0]?.endpoint).toBe(aPeer);

    // Traffic through both replicas: bookings on sessions (held), so load builds on the ranks.
    let n = 0;
    const book = async (): Promise<void> => {
      const d = n % 2 === 0 ? a : b;
      const r = await post(d.url, "/select_and_reserve", { token_ids: prompt(4 + (n % 5), n % 7), session_id: `s${String(n % 6)}`, selection_id: `ui-${String(n)}` });
      expect(r.status).toBe(200);
      n++;
    };
    for (let i = 0; i < 12; i++) await book();
    const busyA = await waitForView(pageA, (v) => v.selTotal >= 6 && v.selRate > 0 && v.bindingsLive > 0 && v.ranks.some((r) => r.blocksFill > 0), "page A: selections, a rate, bindings and a filled bar");
    // Busiest first: the first rank shown carries load.
    expect(busyA.ranks[0]?.blocksFill).toBeGreaterThan(0);
    expect(busyA.rankSummary).not.toContain(" 0 requests");
    // More traffic: the figures move.
    for (let i = 0; i < 10; i++) await book();
    await waitForView(pageA, (v) => v.selTotal > busyA.selTotal, "page A: the selection count to grow");

    // Both replicas see the whole fleet's load: once replication settles, their pages agree.
    const loadsOf = (d: DaemonProcess): Promise<unknown> => getJson(d.url, "/loads");
    await waitFor(async () => JSON.stringify(await loadsOf(a)) === JSON.stringify(await loadsOf(b)), 10_000, "the replicas' loads to converge");
    const inFlight = (v: PageView): string => /In flight: [^.]*/.exec(v.rankSummary)?.[0] ?? "";
    await waitFor(async () => inFlight(await view(pageA)) !== "" && inFlight(await view(pageA)) === inFlight(await view(pageB)), PAGE_WAIT_MS, "both pages to show the same load");
    expect(inFlight(await view(pageA))).toContain(`${String(n)} requests`);

    // The search narrows the ranks to one worker (input goes to the front tab).
    await pageA.bringToFront();
    await pageA.type("#search", "3");
    const searched = await waitForView(pageA, (v) => v.ranks.length === 2 && v.ranks.every((r) => r.worker === "3"), "the search to keep worker 3's two ranks");
    expect(searched.rankSummary).toContain('2 of 8 ranks match "3"');

    mkdirSync("reports", { recursive: true });
    await pageA.click("#search", { count: 3 });
    await pageA.keyboard.press("Backspace");
    await waitForView(pageA, (v) => v.ranks.length === 8, "the search cleared");
    await pageA.screenshot({ path: SCREENSHOT, fullPage: true });
    expect(existsSync(SCREENSHOT)).toBe(true);

    // A deregistered peer leaves the page, on both sides (deregistering tells the peer too).
    expect((await post(a.url, "/replica_sync/deregister_peer", { endpoint: bPeer })).status).toBe(200);
    const alone = await waitForView(pageA, (v) => v.peers.length === 0, "page A: the deregistered peer gone");
    expect(alone.bodyText).toContain("no peers");
    await waitForView(pageB, (v) => v.peers.length === 0, "page B: the deregistered peer gone");
    expect(errors).toEqual([]);
  }, 120_000);

  it("stays readable at 1,024 ranks: a summary, the busiest 48 drawn, more on request, and a search", async () => {
    const d = await spawnDaemon(["--no-kv-events"]);
    procs.push(d);
    // 512 workers of 2 ranks; a few carry load, so "busiest first" has something to sort.
    for (let i = 0; i < 512; i += 64) {
      await Promise.all(
        Array.from({ length: 64 }, async (_, k) => {
          const r = await post(d.url, "/workers", { worker_id: 1_000 + i + k, endpoint: `http://w${String(i + k)}`, block_size: 16, total_kv_blocks: 128, data_parallel_size: 2 });
          expect(r.status).toBe(201);
        }),
      );
    }
    for (let i = 0; i < 5; i++) expect((await post(d.url, "/select_and_reserve", { token_ids: prompt(8, i) })).status).toBe(200);
    const page = await browser.newPage();
    await page.setViewport({ width: 1280, height: 1000 });
    await page.goto(`${d.url}/ui`, { waitUntil: "domcontentloaded" });
    const v = await waitForView(page, (x) => x.ranks.length === 48, "48 rank rows");
    expect(v.rankSummary).toContain("1,024 ranks; showing the 48 busiest");
    expect(v.rankSummary).toContain("In flight: 5 requests on 5 ranks");
    expect(v.ranks.slice(0, 5).every((r) => r.blocksFill > 0)).toBe(true);
    expect(v.ranks.slice(5).every((r) => r.blocksFill === 0)).toBe(true);
    await page.select("#top", "1024");
    await waitForView(page, (x) => x.ranks.length === 1_024, "all 1,024 rank rows on request");
    await page.type("#search", "1077");
    const found = await waitForView(page, (x) => x.ranks.length === 2, "worker 1077's two ranks");
    expect(found.ranks.map((r) => `${r.worker}/${r.rank}`).sort()).toEqual(["1077/0", "1077/1"]);
    expect(found.rankSummary).toContain('2 of 1,024 ranks match "1077"');
  }, 60_000);

  it("with --api-token-file, shows a token prompt and no data until the right token is entered", async () => {
    const tokenFile = join(dir, "token");
    writeFileSync(tokenFile, `${TOKEN}\n`, { mode: 0o600 });
    chmodSync(tokenFile, 0o600);
    const d = await spawnDaemon(["--no-kv-events", "--api-token-file", tokenFile]);
    procs.push(d);
    const id = (await (await fetch(`${d.url}/ui/state`, { headers: { authorization: `Bearer ${TOKEN}` } })).json() as { replica: { id: string } }).replica.id;
    const page = await browser.newPage();
    await page.goto(`${d.url}/ui`, { waitUntil: "domcontentloaded" });
    const locked = await waitForView(page, (v) => v.authShown, "the token prompt");
    expect(locked.dataShown).toBe(false);
    expect(locked.bodyText).toContain("API token required");
    expect(locked.bodyText).not.toContain(id);
    expect(locked.replicaId).toBe("-");

    await page.type("#auth-token", `${TOKEN.slice(0, -1)}x`);
    await page.click("#auth-form button");
    const refused = await waitForView(page, (v) => v.authShown && v.authError !== "", "the refusal");
    expect(refused.authError).toContain("refused");
    expect(refused.bodyText).not.toContain(id);

    await page.type("#auth-token", TOKEN);
    await page.click("#auth-form button");
    const open = await waitForView(page, (v) => v.dataShown && v.replicaId === id, "the data after the token");
    expect(open.authShown).toBe(false);
    // The token is this tab's (sessionStorage): a reload keeps showing data without asking again.
    await page.reload({ waitUntil: "domcontentloaded" });
    await waitForView(page, (v) => v.dataShown && v.replicaId === id, "the data after a reload");
  }, 60_000);
});
