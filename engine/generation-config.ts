// A checkpoint's sampling defaults: generation_config.json, with config.json's eos_token_id as
// the fallback end-of-sequence id, the way Hugging Face transformers resolves them; a GGUF
// file's EOS and end-of-turn tokens.
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { GgufMetadata, ggufFileOf, readGgufHeader } from '../gguf.ts';

export interface GenerationDefaults {
  temperature?: number;
  topP?: number;
  topK?: number;
  maxNewTokens?: number;
  /** Tokens that end a request unless it sets ignoreEos. */
  eosTokenIds: number[];
}

type JsonObject = Record<string, unknown>;

function readJsonObject(file: string): JsonObject | null {
  if (!existsSync(file)) return null;
  const parsed: unknown = JSON.parse(readFileSync(file, 'utf8'));
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
    throw new Error(`${file}: expected a JSON object`);
  }
  return parsed as JsonObject;
}

function optionalNumber(json: JsonObject, key: string): number | undefined {
  const value = json[key];
  return typeof value === 'number' && Number.isFinite(value) ? value : undefined;
}

/** eos_token_id is an int or a list of ints in the wild. */
function tokenIdList(value: unknown): number[] | undefined {
  if (Number.isInteger(value)) return [value as number];
  if (Array.isArray(value) && value.every((id) => Number.isInteger(id))) return value as number[];
  return undefined;
}

/** A GGUF file's end-of-sequence tokens: its EOS and end-of-turn ids (llama.cpp stops on both). */
function ggufEosTokenIds(file: string): number[] {
  const meta = new GgufMetadata(readGgufHeader(file));
  const keys = ['tokenizer.ggml.eos_token_id', 'tokenizer.ggml.eot_token_id'].filter((key) => meta.has(key));
  return [...new Set(keys.map((key) => meta.number(key)))];
}

export function readGenerationDefaults(modelDir: string): GenerationDefaults {
  const ggufFile = ggufFileOf(modelDir);
  if (ggufFile !== null) return { eosTokenIds: ggufEosTokenIds(ggufFile) };
  const generation = readJsonObject(path.join(modelDir, 'generation_config.json')) ?? {};
  const config = readJsonObject(path.join(modelDir, 'config.json')) ?? {};
  // do_sample: false is transformers' greedy switch; it overrides any temperature in the file.
  const greedy = generation.do_sample === false;
  return {
    temperature: greedy ? 0 : optionalNumber(generation, 'temperature'),
    topP: greedy ? undefined : optionalNumber(generation, 'top_p'),
    topK: greedy ? undefined : optionalNumber(generation, 'top_k'),
    maxNewTokens: optionalNumber(generation, 'max_new_tokens'),
    eosTokenIds: tokenIdList(generation.eos_token_id) ?? tokenIdList(config.eos_token_id) ?? [],
  };
}
