// The architectures the runtime loads, by config.json's architectures[0].
import type { Architecture } from '../api.ts';
import type { Family } from './common.ts';
import { gemma3 } from './gemma3.ts';
import { gptOss } from './gpt-oss.ts';
import { llamaFamily } from './llama.ts';
import { mixtral } from './mixtral.ts';
import { phi3 } from './phi3.ts';
import { qwen3, qwen3Moe } from './qwen3.ts';

export type { FamilyModel } from './common.ts';

export const FAMILIES: Readonly<Record<Architecture, Family>> = {
  LlamaForCausalLM: llamaFamily('LlamaForCausalLM'),
  MistralForCausalLM: llamaFamily('MistralForCausalLM'),
  Qwen2ForCausalLM: llamaFamily('Qwen2ForCausalLM'),
  Qwen3ForCausalLM: qwen3,
  Qwen3MoeForCausalLM: qwen3Moe,
  MixtralForCausalLM: mixtral,
  Gemma3ForCausalLM: gemma3,
  Gemma3ForConditionalGeneration: gemma3,
  Phi3ForCausalLM: phi3,
  GptOssForCausalLM: gptOss,
};
