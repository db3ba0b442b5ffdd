import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { kvBytesPerBlock } from '../kv/cache-size.ts';

function withConfig(config: Record<string, unknown>, body: (modelDir: string) => void) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-cache-size-'));
  try {
    writeFileSync(path.join(dir, 'config.json'), JSON.stringify(config));
    body(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const llama = { num_hidden_layers: 4, num_attention_heads: 8, num_key_value_heads: 2, hidden_size: 256, torch_dtype: 'bfloat16' };

test('K and V of every layer and KV head, in the cache dtype', () => {
  withConfig(llama, (dir) => {
    // 2 x 4 layers x 2 KV heads x 32 dims x 16 tokens x 2 bytes
    assert.equal(kvBytesPerBlock(dir, 'auto', 'auto', 16), 16384);
    assert.equal(kvBytesPerBlock(dir, 'fp32', 'auto', 16), 32768);
    assert.equal(kvBytesPerBlock(dir, 'fp32', 'fp16', 16), 16384);
  });
});

test('head_dim and num_key_value_heads follow transformers defaults', () => {
  withConfig({ ...llama, num_key_value_heads: undefined, head_dim: 64 }, (dir) => {
    assert.equal(kvBytesPerBlock(dir, 'auto', 'auto', 16), 2 * 4 * 8 * 64 * 16 * 2);
  });
});

test('without torch_dtype the widest dtype keeps the cache within its byte budget', () => {
  withConfig({ ...llama, torch_dtype: undefined }, (dir) => {
    assert.equal(kvBytesPerBlock(dir, 'auto', 'auto', 16), 32768);
  });
});

test('a malformed config names the file and the field', () => {
  withConfig({ ...llama, num_hidden_layers: 0 }, (dir) => {
    assert.throws(() => kvBytesPerBlock(dir, 'auto', 'auto', 16), /config\.json: expected a positive integer for num_hidden_layers but received 0/);
  });
});
