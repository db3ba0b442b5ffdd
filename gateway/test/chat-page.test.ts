// The chat page at / in headless Chromium, against a real gateway over the scripted engine:
// type, send, watch tokens arrive, continue the conversation, stop a reply mid-stream.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { chromium, type Browser, type Page } from 'playwright-core';
import { MAX_MODEL_LEN, MODEL_NAME, startTestGateway, type TestGateway } from './harness.ts';
import type { Script } from './scripted-engine.ts';
import { chromium as chromiumTool, requireExecutable } from '../../test/system-tools.ts';

let gateway: TestGateway;
let browser: Browser;
let script: Script = { steps: [] };

before(async () => {
  gateway = await startTestGateway(() => script);
  browser = await chromium.launch({ executablePath: requireExecutable(chromiumTool), args: ['--no-sandbox'] });
});
after(async () => {
  await browser?.close();
  await gateway?.close();
});

async function openPage(): Promise<Page> {
  const page = await browser.newPage();
  await page.goto(gateway.baseUrl);
  // The model list comes from /v1/models.
  await page.waitForFunction(() => (document.getElementById('model') as HTMLSelectElement).options.length > 0);
  return page;
}

async function say(page: Page, text: string) {
  await page.fill('#prompt', text);
  await page.click('#send');
}

test('the page lists the models, streams a reply token by token and continues the conversation', async () => {
  const page = await openPage();
  assert.deepEqual(await page.$$eval('#model option', (options) => options.map((option) => option.textContent)), [MODEL_NAME, 'plain']);
  // One token per step: the reply grows in the page as the events arrive.
  script = { steps: gateway.tokens(' Hello there, friend.').map((id) => [id]), finishReason: 'stop' };
  await say(page, 'Hi!');
  await page.waitForSelector('.turn.meta');
  assert.equal(await page.textContent('.turn.user'), 'Hi!');
  assert.equal(await page.textContent('.turn.assistant'), ' Hello there, friend.');

  script = { steps: [gateway.tokens(' Again.')], finishReason: 'stop' };
  await say(page, 'And again?');
  await page.waitForFunction(() => document.querySelectorAll('.turn.meta').length === 2);
  assert.deepEqual(await page.$$eval('.turn.assistant', (turns) => turns.map((turn) => turn.textContent)), [' Hello there, friend.', ' Again.']);
  // The second turn was chained by previous_response_id: its prompt holds the first exchange.
  const prompt = gateway.tokenizer.decode(gateway.engine.requests.at(-1)!.promptTokenIds, { skipSpecialTokens: false });
  assert.match(prompt, /Hi!.*Hello there, friend\..*And again\?/s);
  await page.close();
});

test('the page shows its reply limit (a quarter of a small context), sends it with truncation "auto", and keeps a limit the user sets', async () => {
  const page = await openPage();
  assert.equal(await page.inputValue('#max-output-tokens'), String(MAX_MODEL_LEN / 4));
  script = { steps: [gateway.tokens(' Fine.')], finishReason: 'length' };
  await say(page, 'How long?');
  await page.waitForSelector('.turn.meta');
  assert.equal(gateway.engine.requests.at(-1)!.sampling.maxTokens, MAX_MODEL_LEN / 4);
  assert.equal(await page.textContent('.turn.meta'), `2 tokens, cut at the reply limit of ${MAX_MODEL_LEN / 4}`);

  await page.fill('#max-output-tokens', '5');
  await page.dispatchEvent('#max-output-tokens', 'change');
  await page.selectOption('#model', 'plain');
  await page.selectOption('#model', MODEL_NAME);
  assert.equal(await page.inputValue('#max-output-tokens'), '5');
  script = { steps: [gateway.tokens(' Shorter.')], finishReason: 'stop' };
  await say(page, 'And now?');
  await page.waitForFunction(() => document.querySelectorAll('.turn.meta').length === 2);
  assert.equal(gateway.engine.requests.at(-1)!.sampling.maxTokens, 5);
  await page.close();
});

test('Stop cancels the reply in the worker, and the next turn still works', async () => {
  const page = await openPage();
  script = { steps: gateway.tokens(' one two three').map((id) => [id]), hang: true };
  await say(page, 'Count forever');
  await page.waitForFunction(() => document.querySelector('.turn.assistant')?.textContent === ' one two three');
  const aborted = new Promise((resolve) => gateway.engine.once('abort', resolve));
  await page.click('#stop');
  assert.equal(await aborted, gateway.engine.requests.at(-1)!.requestId);
  await page.waitForSelector('#send:not([disabled])');

  script = { steps: [gateway.tokens(' Done.')], finishReason: 'stop' };
  await say(page, 'Stop counting');
  await page.waitForFunction(() => document.querySelectorAll('.turn.assistant')[1]?.textContent === ' Done.');
  await page.close();
});

test('an error reaches the page as a message, not a silent hang', async () => {
  const page = await openPage();
  await page.selectOption('#model', 'plain');
  await say(page, 'Hi');
  await page.waitForSelector('.turn.error');
  assert.match((await page.textContent('.turn.error')) ?? '', /chat template/);
  await page.close();
});

test('with keys configured, the page works once given its key: /v1/models by header, the WebSocket by subprotocol', async () => {
  const key = 'sk-page-3c5e7a9b';
  const keyed = await startTestGateway(() => script, { gatewayOptions: { access: { apiKeys: [{ name: 'page', key, limits: {} }] } } });
  const page = await browser.newPage();
  try {
    // The page itself is public; what it asks for without a key is refused.
    await page.goto(keyed.baseUrl);
    await page.waitForSelector('.turn.error');
    assert.match((await page.textContent('.turn.error')) ?? '', /You didn't provide an API key/);

    await page.fill('#api-key', key);
    await page.dispatchEvent('#api-key', 'change');
    await page.waitForFunction(() => (document.getElementById('model') as HTMLSelectElement).options.length > 0);
    // A browser fails a handshake that selects none of the subprotocols it offered: this reply
    // proves the server selected `conduit.responses`, not the key.
    script = { steps: [keyed.tokens(' Keyed.')], finishReason: 'stop' };
    await say(page, 'Hello');
    await page.waitForSelector('.turn.meta');
    assert.equal(await page.textContent('.turn.assistant'), ' Keyed.');
  } finally {
    await page.close();
    await keyed.close();
  }
});
