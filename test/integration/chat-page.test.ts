// The chat page at / on the real server (conduit-tiny, a 2,048-token context) in headless
// Chromium: ten turns whose user messages alone are longer than the context, each answered,
// because the page asks for truncation "auto" and a reply limit it shows.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { chromium, type Browser } from 'playwright-core';
import type { RunningServer } from '../../bin/serve.ts';
import { chromium as chromiumTool, requireExecutable } from '../system-tools.ts';
import { boundedFetch, defaultModelDir, startServer, WAIT_BOUND_MS } from './harness.ts';

const NUM_TURNS = 10;
/** A verse of about 22 tokens; twelve of them make a user message of about 270. */
const VERSE = 'And the LORD spake unto Moses, saying, Speak unto the children of Israel, and say unto them, ';
let server: RunningServer;
let browser: Browser;

before(async () => {
  server = await startServer([{ path: defaultModelDir, num_workers: 1, threads_per_worker: 1 }]);
  browser = await chromium.launch({ executablePath: requireExecutable(chromiumTool), args: ['--no-sandbox'] });
});
after(async () => {
  await browser?.close();
  await server?.close();
});

async function tokenCount(text: string): Promise<number> {
  const response = await boundedFetch(`${server.httpAddress}/tokenize`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'conduit-tiny', prompt: text, add_special_tokens: false }),
  });
  return ((await response.json()) as { count: number }).count;
}

test('ten turns on conduit-tiny, each answered, though the conversation outgrows the context', async () => {
  const page = await browser.newPage();
  try {
    await page.goto(server.httpAddress);
    await page.waitForFunction(() => (document.getElementById('model') as HTMLSelectElement).options.length > 0);
    // The page shows its reply limit: 256 tokens, a quarter of the context at most.
    assert.equal(await page.inputValue('#max-output-tokens'), '256');
    const message = `${VERSE.repeat(12)}Amen.`;
    const numMessageTokens = await tokenCount(message);
    assert.ok(NUM_TURNS * numMessageTokens > 2048, `${numMessageTokens} tokens a message: the user messages alone must outgrow the context`);
    for (let turn = 1; turn <= NUM_TURNS; turn++) {
      await page.fill('#prompt', message);
      await page.click('#send');
      await page.waitForFunction((n) => document.querySelectorAll('.turn.meta, .turn.error').length >= n, turn, { timeout: WAIT_BOUND_MS });
      const errors = await page.$$eval('.turn.error', (turns) => turns.map((element) => element.textContent));
      assert.deepEqual(errors, [], `turn ${turn}`);
      const meta = await page.$$eval('.turn.meta', (turns) => turns.map((element) => element.textContent ?? ''));
      // "N tokens", or "256 tokens, cut at the reply limit of 256".
      assert.match(meta[turn - 1], /^\d+ tokens(, cut at the reply limit of 256)?$/, `turn ${turn}`);
      assert.ok(Number(meta[turn - 1].split(' ')[0]) >= 1, `turn ${turn}: ${meta[turn - 1]}`);
    }
    assert.equal(await page.$$eval('.turn.assistant', (turns) => turns.length), NUM_TURNS);
    // The last turn's prompt was cut to fit with room for its reply.
    // The page script's own state (a top-level const of its script) names the response it chains from.
    const lastId = (await page.evaluate('state.previousResponseId')) as string;
    const last = (await (await boundedFetch(`${server.httpAddress}/v1/responses/${lastId}`)).json()) as {
      truncation: string; max_output_tokens: number; usage: { input_tokens: number };
    };
    assert.deepEqual({ truncation: last.truncation, max_output_tokens: last.max_output_tokens }, { truncation: 'auto', max_output_tokens: 256 });
    assert.ok(last.usage.input_tokens + 256 <= 2048, `${last.usage.input_tokens} input tokens`);
  } finally {
    await page.close();
  }
});
