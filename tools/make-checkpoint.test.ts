import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { readCheckpointTensors, readSafetensorsHeader, readTensorF64 } from '../native/safetensors.ts';
import {
  DEFAULT_OPTIONS,
  PyFloat,
  parseCliOptions,
  toPythonJson,
  writeRandomCheckpoint,
  type CheckpointOptions,
} from './make-checkpoint.ts';

function withTempDir(fn: (dir: string) => void): void {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'make-checkpoint-test-'));
  try {
    fn(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function tinyOptions(outDir: string, overrides: Partial<CheckpointOptions> = {}): CheckpointOptions {
  return {
    ...DEFAULT_OPTIONS,
    outDir,
    hiddenSize: 16,
    numLayers: 2,
    numHeads: 4,
    numKvHeads: 2,
    intermediateSize: 24,
    vocabSize: 40,
    ...overrides,
  };
}

const readJson = (file: string): Record<string, unknown> => JSON.parse(readFileSync(file, 'utf8'));

test('toPythonJson writes what json.dumps(indent=2, sort_keys=True) writes', () => {
  const value = {
    z: [1, 'two', null, true],
    a: { eps: new PyFloat(1e-5), theta: new PyFloat(10000), zero: new PyFloat(0), empty: [], none: {} },
    floats: [0.0001, 1e16, 1e15, 0.5, -2.5e-7, 123.456, 1.5e20].map((x) => new PyFloat(x)),
  };
  assert.equal(
    toPythonJson(value),
    [
      '{',
      '  "a": {',
      '    "empty": [],',
      '    "eps": 1e-05,',
      '    "none": {},',
      '    "theta": 10000.0,',
      '    "zero": 0.0',
      '  },',
      '  "floats": [',
      '    0.0001,',
      '    1e+16,',
      '    1000000000000000.0,',
      '    0.5,',
      '    -2.5e-07,',
      '    123.456,',
      '    1.5e+20',
      '  ],',
      '  "z": [',
      '    1,',
      '    "two",',
      '    null,',
      '    true',
      '  ]',
      '}',
    ].join('\n'),
  );
  assert.throws(() => toPythonJson({ x: 0.5 }), /wrap floats in PyFloat/);
});

test('llama config.json has the transformers fields, untied tensors and HF shapes', () => {
  withTempDir((dir) => {
    writeRandomCheckpoint(tinyOptions(dir, { ropeScalingLlama3: true, headDim: 6, dtype: 'fp16' }));
    const config = readJson(path.join(dir, 'config.json'));
    assert.deepEqual(config, {
      architectures: ['LlamaForCausalLM'],
      attention_bias: false,
      attention_dropout: 0,
      bos_token_id: 1,
      eos_token_id: 2,
      head_dim: 6,
      hidden_act: 'silu',
      hidden_size: 16,
      initializer_range: 0.02,
      intermediate_size: 24,
      max_position_embeddings: 2048,
      mlp_bias: false,
      model_type: 'llama',
      num_attention_heads: 4,
      num_hidden_layers: 2,
      num_key_value_heads: 2,
      pretraining_tp: 1,
      rms_norm_eps: 1e-6,
      rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192 },
      rope_theta: 10000,
      tie_word_embeddings: false,
      torch_dtype: 'float16',
      use_cache: true,
      vocab_size: 40,
    });
    const { tensors } = readCheckpointTensors(dir);
    assert.equal(tensors.size, 1 + 2 * 9 + 2);
    const shapes = Object.fromEntries([...tensors].map(([name, t]) => [name, t.shape]));
    assert.deepEqual(shapes['model.embed_tokens.weight'], [40, 16]);
    assert.deepEqual(shapes['model.layers.1.self_attn.q_proj.weight'], [24, 16]);
    assert.deepEqual(shapes['model.layers.1.self_attn.k_proj.weight'], [12, 16]);
    assert.deepEqual(shapes['model.layers.1.self_attn.v_proj.weight'], [12, 16]);
    assert.deepEqual(shapes['model.layers.1.self_attn.o_proj.weight'], [16, 24]);
    assert.deepEqual(shapes['model.layers.0.mlp.gate_proj.weight'], [24, 16]);
    assert.deepEqual(shapes['model.layers.0.mlp.up_proj.weight'], [24, 16]);
    assert.deepEqual(shapes['model.layers.0.mlp.down_proj.weight'], [16, 24]);
    assert.deepEqual(shapes['model.layers.0.input_layernorm.weight'], [16]);
    assert.deepEqual(shapes['model.layers.0.post_attention_layernorm.weight'], [16]);
    assert.deepEqual(shapes['model.norm.weight'], [16]);
    assert.deepEqual(shapes['lm_head.weight'], [40, 16]);
    assert.ok([...tensors.values()].every((t) => t.dtype === 'F16'));
    assert.deepEqual(readJson(path.join(dir, 'generation_config.json')), { _from_model_config: true, bos_token_id: 1, eos_token_id: 2 });
  });
});

test('mistral config.json carries sliding_window and no head_dim unless set', () => {
  withTempDir((dir) => {
    writeRandomCheckpoint(tinyOptions(dir, { arch: 'mistral', slidingWindow: 5, tieWordEmbeddings: true, dtype: 'fp32' }));
    const config = readJson(path.join(dir, 'config.json'));
    assert.deepEqual(config.architectures, ['MistralForCausalLM']);
    assert.equal(config.model_type, 'mistral');
    assert.equal(config.sliding_window, 5);
    assert.equal(config.tie_word_embeddings, true);
    assert.equal(config.torch_dtype, 'float32');
    assert.ok(!('head_dim' in config));
    assert.ok(!('rope_scaling' in config));
    assert.ok(!('attention_bias' in config));
    const { tensors } = readCheckpointTensors(dir);
    assert.ok(!tensors.has('lm_head.weight'));
    assert.ok(![...tensors.keys()].some((name) => name.endsWith('.bias')));
  });
});

test('qwen2 checkpoints have q/k/v biases and the Qwen2 sliding-window keys switched off', () => {
  withTempDir((dir) => {
    writeRandomCheckpoint(tinyOptions(dir, { arch: 'qwen2' }));
    const config = readJson(path.join(dir, 'config.json'));
    assert.deepEqual(config.architectures, ['Qwen2ForCausalLM']);
    assert.equal(config.model_type, 'qwen2');
    assert.equal(config.use_sliding_window, false);
    assert.equal(config.sliding_window, null);
    assert.equal(config.max_window_layers, 2);
    assert.equal(config.rope_scaling, null);
    const { tensors } = readCheckpointTensors(dir);
    assert.deepEqual(tensors.get('model.layers.0.self_attn.q_proj.bias')?.shape, [16]);
    assert.deepEqual(tensors.get('model.layers.1.self_attn.k_proj.bias')?.shape, [8]);
    assert.deepEqual(tensors.get('model.layers.1.self_attn.v_proj.bias')?.shape, [8]);
    assert.ok(!tensors.has('model.layers.0.self_attn.o_proj.bias'));
  });
  withTempDir((dir) => {
    assert.throws(() => writeRandomCheckpoint(tinyOptions(dir, { arch: 'qwen2', slidingWindow: 4 })), /not a qwen2 setting/);
  });
});

test('weights depend only on the seed and tensor name, not on sharding', () => {
  withTempDir((dir) => {
    const single = path.join(dir, 'single');
    const sharded = path.join(dir, 'sharded');
    const reseeded = path.join(dir, 'reseeded');
    writeRandomCheckpoint(tinyOptions(single, { seed: 7 }));
    writeRandomCheckpoint(tinyOptions(sharded, { seed: 7, numShards: 3 }));
    writeRandomCheckpoint(tinyOptions(reseeded, { seed: 8 }));

    assert.deepEqual(readdirSync(sharded).sort(), [
      'config.json',
      'generation_config.json',
      'model-00001-of-00003.safetensors',
      'model-00002-of-00003.safetensors',
      'model-00003-of-00003.safetensors',
      'model.safetensors.index.json',
    ]);
    const index = readJson(path.join(sharded, 'model.safetensors.index.json')) as {
      metadata: { total_size: number };
      weight_map: Record<string, string>;
    };
    const singleHeader = readSafetensorsHeader(path.join(single, 'model.safetensors'));
    const expectedTotal = [...singleHeader.tensors.values()].reduce((sum, t) => sum + t.dataEnd - t.dataBegin, 0);
    assert.equal(index.metadata.total_size, expectedTotal);
    assert.equal(new Set(Object.values(index.weight_map)).size, 3);

    const shardedTensors = readCheckpointTensors(sharded);
    const reseededTensors = readCheckpointTensors(reseeded);
    assert.deepEqual([...shardedTensors.tensors.keys()].sort(), [...singleHeader.tensors.keys()].sort());
    for (const name of singleHeader.tensors.keys()) {
      const fromSingle = readTensorF64(singleHeader.file, singleHeader, name);
      const shard = shardedTensors.tensors.get(name)!;
      assert.deepEqual(readTensorF64(shard.file, shardedTensors.headers.get(shard.file)!, name), fromSingle, name);
      const other = reseededTensors.tensors.get(name)!;
      assert.notDeepEqual(readTensorF64(other.file, reseededTensors.headers.get(other.file)!, name), fromSingle, name);
    }
  });
});

test('random init: matrices scale as 1/sqrt(fan_in), norms sit near 1', () => {
  withTempDir((dir) => {
    writeRandomCheckpoint(tinyOptions(dir, { hiddenSize: 64, numHeads: 4, numKvHeads: 4, intermediateSize: 128, dtype: 'fp32' }));
    const header = readSafetensorsHeader(path.join(dir, 'model.safetensors'));
    const stats = (name: string) => {
      const values = readTensorF64(header.file, header, name);
      const mean = values.reduce((s, v) => s + v, 0) / values.length;
      const std = Math.sqrt(values.reduce((s, v) => s + (v - mean) ** 2, 0) / values.length);
      return { mean, std };
    };
    const q = stats('model.layers.0.self_attn.q_proj.weight');
    assert.ok(Math.abs(q.mean) < 0.01 && Math.abs(q.std - 1 / 8) < 0.01, JSON.stringify(q));
    const norm = stats('model.layers.0.input_layernorm.weight');
    assert.ok(Math.abs(norm.mean - 1) < 0.05 && norm.std > 0.05 && norm.std < 0.15, JSON.stringify(norm));
  });
});

test('invalid shapes are rejected before anything is written', () => {
  withTempDir((dir) => {
    assert.throws(() => writeRandomCheckpoint(tinyOptions(dir, { numKvHeads: 3 })), /multiple of numKvHeads/);
    assert.throws(() => writeRandomCheckpoint(tinyOptions(dir, { hiddenSize: 18 })), /head dim 4\.5/);
    assert.throws(() => writeRandomCheckpoint(tinyOptions(dir, { headDim: 5 })), /head dim 5 must be an even integer/);
    assert.throws(() => writeRandomCheckpoint(tinyOptions(dir, { eosTokenId: 40 })), /eosTokenId 40 must be a token id below vocabSize 40/);
    assert.deepEqual(readdirSync(dir), []);
  });
});

test('CLI flags map onto options', () => {
  const options = parseCliOptions(
    '--out /tmp/x --hidden 768 --layers 12 --heads 12 --kv-heads 4 --ffn 2048 --vocab 32000 --dtype fp16 --arch mistral --tie --head-dim 32 --sliding-window 64 --rope-theta 500000 --rope-scaling-llama3 --shards 2 --seed 3 --max-pos 4096'.split(
      ' ',
    ),
  );
  assert.deepEqual(options, {
    ...DEFAULT_OPTIONS,
    outDir: '/tmp/x',
    arch: 'mistral',
    dtype: 'fp16',
    hiddenSize: 768,
    numLayers: 12,
    numHeads: 12,
    numKvHeads: 4,
    intermediateSize: 2048,
    vocabSize: 32000,
    tieWordEmbeddings: true,
    headDim: 32,
    slidingWindow: 64,
    ropeTheta: 500000,
    ropeScalingLlama3: true,
    numShards: 2,
    seed: 3,
    maxPositionEmbeddings: 4096,
  });
  assert.throws(() => parseCliOptions(['--out', '/tmp/x']), /--hidden is required/);
  assert.throws(() => parseCliOptions('--out x --hidden 1.5 --layers 1 --heads 1 --kv-heads 1 --ffn 1 --vocab 1'.split(' ')), /--hidden must be/);
  assert.throws(() => parseCliOptions('--out x --hidden 8 --layers 1 --heads 1 --kv-heads 1 --ffn 1 --vocab 9 --arch gpt2'.split(' ')), /--arch/);
});

test('qwen3 and qwen3_moe config.json carry the published fields; q/k norms and per-expert tensors', () => {
  withTempDir((dir) => {
    const qwen3Dir = path.join(dir, 'qwen3');
    writeRandomCheckpoint(tinyOptions(qwen3Dir, { arch: 'qwen3', headDim: 8, tieWordEmbeddings: true, slidingWindow: 5, maxWindowLayers: 1 }));
    const config = readJson(path.join(qwen3Dir, 'config.json'));
    assert.deepEqual(config.architectures, ['Qwen3ForCausalLM']);
    assert.equal(config.model_type, 'qwen3');
    assert.equal(config.head_dim, 8);
    assert.equal(config.use_sliding_window, true);
    assert.equal(config.sliding_window, 5);
    assert.equal(config.max_window_layers, 1);
    assert.equal(config.attention_bias, false);
    const { tensors } = readCheckpointTensors(qwen3Dir);
    assert.deepEqual(tensors.get('model.layers.1.self_attn.q_norm.weight')?.shape, [8]);
    assert.deepEqual(tensors.get('model.layers.1.self_attn.k_norm.weight')?.shape, [8]);
    assert.ok(!tensors.has('lm_head.weight'));

    const moeDir = path.join(dir, 'moe');
    writeRandomCheckpoint(
      tinyOptions(moeDir, { arch: 'qwen3_moe', headDim: 8, numExperts: 4, numExpertsPerToken: 2, moeIntermediateSize: 12, mlpOnlyLayers: [1], normTopkProb: false }),
    );
    const moe = readJson(path.join(moeDir, 'config.json'));
    assert.deepEqual(
      [moe.architectures, moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size, moe.mlp_only_layers, moe.norm_topk_prob, moe.decoder_sparse_step],
      [['Qwen3MoeForCausalLM'], 4, 2, 12, [1], false, 1],
    );
    const moeTensors = readCheckpointTensors(moeDir).tensors;
    assert.deepEqual(moeTensors.get('model.layers.0.mlp.gate.weight')?.shape, [4, 16]);
    assert.deepEqual(moeTensors.get('model.layers.0.mlp.experts.3.down_proj.weight')?.shape, [16, 12]);
    assert.deepEqual(moeTensors.get('model.layers.1.mlp.gate_proj.weight')?.shape, [24, 16]);
    assert.ok(!moeTensors.has('model.layers.1.mlp.gate.weight'));
  });
});

test('mixtral, gemma3 (both layouts), phi3 and gpt_oss lay out config.json and tensors as their published checkpoints do', () => {
  withTempDir((dir) => {
    const write = (name: string, overrides: Partial<CheckpointOptions>) => {
      const outDir = path.join(dir, name);
      writeRandomCheckpoint(tinyOptions(outDir, overrides));
      return { config: readJson(path.join(outDir, 'config.json')), tensors: readCheckpointTensors(outDir).tensors };
    };
    const mixtral = write('mixtral', { arch: 'mixtral', numExperts: 4, numExpertsPerToken: 2, slidingWindow: 6 });
    assert.deepEqual([mixtral.config.architectures, mixtral.config.num_local_experts, mixtral.config.num_experts_per_tok, mixtral.config.sliding_window], [['MixtralForCausalLM'], 4, 2, 6]);
    assert.deepEqual(mixtral.tensors.get('model.layers.0.block_sparse_moe.gate.weight')?.shape, [4, 16]);
    assert.deepEqual(mixtral.tensors.get('model.layers.1.block_sparse_moe.experts.3.w2.weight')?.shape, [16, 24]);

    const gemma = write('gemma', { arch: 'gemma3', headDim: 8, slidingWindow: 4, slidingWindowPattern: 2, tieWordEmbeddings: true });
    assert.deepEqual([gemma.config.architectures, gemma.config.model_type, gemma.config.sliding_window_pattern, gemma.config.query_pre_attn_scalar], [['Gemma3ForCausalLM'], 'gemma3_text', 2, 8]);
    for (const norm of ['input_layernorm', 'post_attention_layernorm', 'pre_feedforward_layernorm', 'post_feedforward_layernorm']) {
      assert.ok(gemma.tensors.has(`model.layers.1.${norm}.weight`), norm);
    }
    const multimodal = write('gemma-mm', { arch: 'gemma3', headDim: 8, slidingWindow: 4, slidingWindowPattern: 2, tieWordEmbeddings: true, gemma3Multimodal: true });
    assert.deepEqual([multimodal.config.architectures, multimodal.config.model_type], [['Gemma3ForConditionalGeneration'], 'gemma3']);
    const textConfig = multimodal.config.text_config as Record<string, unknown>;
    assert.deepEqual([textConfig.model_type, textConfig.hidden_size, textConfig.architectures], ['gemma3_text', 16, undefined]);
    assert.ok(multimodal.tensors.has('model.language_model.layers.1.self_attn.q_norm.weight'));
    assert.ok(multimodal.tensors.has('model.vision_tower.vision_model.embeddings.patch_embedding.weight'));
    assert.ok(!multimodal.tensors.has('model.layers.0.input_layernorm.weight'));

    const phi = write('phi', { arch: 'phi3', partialRotaryFactor: 0.5, longRope: { originalMaxPositionEmbeddings: 64 } });
    assert.deepEqual([phi.config.architectures, phi.config.original_max_position_embeddings], [['Phi3ForCausalLM'], 64]);
    assert.equal((phi.config.rope_scaling as { type: string }).type, 'longrope');
    assert.deepEqual(phi.tensors.get('model.layers.0.self_attn.qkv_proj.weight')?.shape, [16 + 2 * 8, 16]);
    assert.deepEqual(phi.tensors.get('model.layers.0.mlp.gate_up_proj.weight')?.shape, [48, 16]);

    const gptOss = write('gpt-oss', { arch: 'gpt_oss', hiddenSize: 32, headDim: 8, numExperts: 4, numExpertsPerToken: 2, intermediateSize: 32 });
    assert.deepEqual([gptOss.config.architectures, gptOss.config.num_local_experts, gptOss.config.experts_per_token], [['GptOssForCausalLM'], 4, 2]);
    assert.deepEqual(gptOss.config.layer_types, ['sliding_attention', 'full_attention']);
    assert.equal((gptOss.config.quantization_config as { quant_method: string }).quant_method, 'mxfp4');
    assert.deepEqual(gptOss.tensors.get('model.layers.0.mlp.experts.gate_up_proj_blocks')?.shape, [4, 64, 1, 16]);
    assert.deepEqual(gptOss.tensors.get('model.layers.0.mlp.experts.gate_up_proj_scales')?.shape, [4, 64, 1]);
    assert.deepEqual(gptOss.tensors.get('model.layers.0.self_attn.sinks')?.shape, [4]);
  });
});
