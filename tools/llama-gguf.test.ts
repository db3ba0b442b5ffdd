// The GGUF that bench:latency hands llama-server, read back with Hugging Face's GGUF parser:
// llama.cpp's names, shapes and types, the tokenizer, and every tensor's bytes where the
// metadata says they are (the rotary rows of q and k permuted, the norms widened to F32).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { gguf } from '@huggingface/gguf';
import { bf16BitsToNumber, readCheckpointTensors } from '../native/safetensors.ts';
import { DEFAULT_OPTIONS, writeRandomCheckpoint } from './make-checkpoint.ts';
import { writeLlamaGguf } from './llama-gguf.ts';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const SHAPE = { hiddenSize: 64, numLayers: 2, numHeads: 4, numKvHeads: 2, intermediateSize: 96, vocabSize: 4100 };
const GGML_F32 = 0;
const GGML_BF16 = 30;

function checkpoint(t: { after(fn: () => void): void }, overrides: Record<string, unknown> = {}): string {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-gguf-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  writeRandomCheckpoint({ ...DEFAULT_OPTIONS, ...SHAPE, outDir: dir, dtype: 'bf16', tieWordEmbeddings: false, seed: 5, ...overrides });
  for (const file of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(path.join(repoRoot, 'models', 'conduit-tiny', file), path.join(dir, file));
  return dir;
}

test('a Llama checkpoint becomes a GGUF with llama.cpp names, types, tokenizer and the very bytes', async (t) => {
  const dir = checkpoint(t);
  const file = path.join(dir, 'model.gguf');
  writeLlamaGguf(dir, file);
  const parsed = await gguf(file, { allowLocalFile: true });
  const { metadata } = parsed as unknown as { metadata: Record<string, unknown> };
  assert.equal(metadata['general.architecture'], 'llama');
  assert.equal(metadata['llama.embedding_length'], 64);
  assert.equal(metadata['llama.block_count'], 2);
  assert.equal(metadata['llama.attention.head_count'], 4);
  assert.equal(metadata['llama.attention.head_count_kv'], 2);
  assert.equal(metadata['llama.feed_forward_length'], 96);
  assert.equal(metadata['llama.rope.dimension_count'], 16);
  assert.equal(metadata['llama.context_length'], DEFAULT_OPTIONS.maxPositionEmbeddings);
  assert.equal(metadata['general.file_type'], 32);
  const tokenizer = JSON.parse(readFileSync(path.join(dir, 'tokenizer.json'), 'utf8'));
  const tokens = metadata['tokenizer.ggml.tokens'] as string[];
  const types = metadata['tokenizer.ggml.token_type'] as number[];
  assert.equal(tokens.length, SHAPE.vocabSize);
  for (const [token, id] of Object.entries(tokenizer.model.vocab as Record<string, number>)) assert.equal(tokens[id], token);
  assert.equal(tokens[4095], '<|endoftext|>');
  assert.equal(types[4095], 3);
  assert.equal(types[0], 1);
  assert.deepEqual([tokens[4096], types[4096]], ['[PAD4096]', 5]);
  assert.equal((metadata['tokenizer.ggml.merges'] as string[]).length, tokenizer.model.merges.length);
  assert.equal(metadata['tokenizer.ggml.model'], 'gpt2');
  assert.equal(metadata['tokenizer.ggml.eos_token_id'], 4095);
  assert.equal(metadata['tokenizer.ggml.add_bos_token'], false);

  const infos = new Map(parsed.tensorInfos.map((info) => [info.name, info]));
  assert.equal(infos.size, 3 + 9 * SHAPE.numLayers);
  const q = infos.get('blk.1.attn_q.weight')!;
  assert.deepEqual([q.shape.map(Number), q.dtype], [[64, 64], GGML_BF16]);
  assert.deepEqual(infos.get('blk.0.attn_k.weight')!.shape.map(Number), [64, 32]);
  assert.deepEqual(infos.get('token_embd.weight')!.shape.map(Number), [64, SHAPE.vocabSize]);
  assert.equal(infos.get('blk.0.ffn_norm.weight')!.dtype, GGML_F32);

  const bytes = readFileSync(file);
  const source = readCheckpointTensors(dir).tensors;
  const hfBytes = (name: string) => {
    const info = source.get(name)!;
    return readFileSync(info.file).subarray(info.dataBegin, info.dataEnd);
  };
  const at = (name: string, numBytes: number) => {
    const start = Number(parsed.tensorDataOffset + infos.get(name)!.offset);
    return bytes.subarray(start, start + numBytes);
  };
  // Row 2i + j of head h is the Hugging Face row j * 8 + i of that head (head dim 16).
  for (const [ggufName, hfName, numHeads] of [['blk.1.attn_q.weight', 'model.layers.1.self_attn.q_proj.weight', 4], ['blk.0.attn_k.weight', 'model.layers.0.self_attn.k_proj.weight', 2]] as const) {
    const hf = hfBytes(hfName);
    const out = at(ggufName, hf.length);
    const rowBytes = 64 * 2;
    for (let head = 0; head < numHeads; head++) {
      for (let i = 0; i < 8; i++) {
        for (let j = 0; j < 2; j++) {
          const from = (head * 16 + j * 8 + i) * rowBytes;
          const to = (head * 16 + 2 * i + j) * rowBytes;
          assert.deepEqual(out.subarray(to, to + rowBytes), hf.subarray(from, from + rowBytes), `${ggufName} head ${head} pair ${i}.${j}`);
        }
      }
    }
  }
  for (const [ggufName, hfName] of [['blk.0.attn_v.weight', 'model.layers.0.self_attn.v_proj.weight'], ['output.weight', 'lm_head.weight'], ['token_embd.weight', 'model.embed_tokens.weight']]) {
    const hf = hfBytes(hfName);
    assert.ok(at(ggufName, hf.length).equals(hf), ggufName);
  }
  const norm = hfBytes('model.layers.0.post_attention_layernorm.weight');
  const widened = at('blk.0.ffn_norm.weight', norm.length * 2);
  for (let i = 0; i < 64; i++) assert.equal(widened.readFloatLE(4 * i), bf16BitsToNumber(norm.readUInt16LE(2 * i)));
});

test('a tied checkpoint has no output matrix; other architectures and tokenizers are refused by name', (t) => {
  const tied = checkpoint(t, { tieWordEmbeddings: true });
  writeLlamaGguf(tied, path.join(tied, 'model.gguf'));
  const mistral = checkpoint(t, { arch: 'mistral' });
  assert.throws(() => writeLlamaGguf(mistral, path.join(mistral, 'model.gguf')), /only LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, .* are converted, not MistralForCausalLM/);
  const wordLevel = checkpoint(t);
  const tokenizerFile = path.join(wordLevel, 'tokenizer.json');
  const tokenizer = JSON.parse(readFileSync(tokenizerFile, 'utf8'));
  writeFileSync(tokenizerFile, JSON.stringify({ ...tokenizer, pre_tokenizer: { type: 'Whitespace' } }));
  assert.throws(() => writeLlamaGguf(wordLevel, path.join(wordLevel, 'model.gguf')), /byte-level BPE/);
});
