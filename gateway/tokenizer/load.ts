// Picks a tokenizer backend from what a checkpoint directory holds.
import { existsSync } from 'node:fs';
import path from 'node:path';
import { GgufMetadata, ggufFileOf, readGgufHeader } from '../../gguf.ts';
import { loadGgufTokenizer } from './gguf-tokenizer.ts';
import { loadHuggingFaceTokenizer } from './hf-tokenizer.ts';
import { isBundledEncoding, loadBundledTiktoken, loadTiktokenRanksFile } from './tiktoken-tokenizer.ts';
import type { Tokenizer } from './tokenizer.ts';
import { readTokenizerConfig, type TokenizerConfig } from './tokenizer-config.ts';

export interface LoadedTokenizer {
  tokenizer: Tokenizer;
  config: TokenizerConfig;
}

/**
 * A GGUF file (or a directory holding one and no config.json): its embedded tokenizer. Else, in
 * order: tokenizer.json (Hugging Face); the tiktoken encoding that tokenizer_config.json
 * names; a tiktoken ranks file in tokenizer.model.
 */
export function loadTokenizer(modelDir: string): LoadedTokenizer {
  const ggufFile = ggufFileOf(modelDir);
  if (ggufFile !== null) return loadGgufTokenizer(new GgufMetadata(readGgufHeader(ggufFile)));
  const config = readTokenizerConfig(modelDir);
  const tokenizerJson = path.join(modelDir, 'tokenizer.json');
  if (existsSync(tokenizerJson)) return { tokenizer: loadHuggingFaceTokenizer(tokenizerJson, config), config };
  if (config.tiktokenEncoding !== null) {
    if (!isBundledEncoding(config.tiktokenEncoding)) {
      throw new Error(`${modelDir}: tokenizer_config.json names an unknown tiktoken_encoding "${config.tiktokenEncoding}"`);
    }
    return { tokenizer: loadBundledTiktoken(config.tiktokenEncoding, config), config };
  }
  const ranksFile = path.join(modelDir, 'tokenizer.model');
  if (existsSync(ranksFile)) return { tokenizer: loadTiktokenRanksFile(ranksFile, config), config };
  throw new Error(
    `${modelDir}: no tokenizer found (expected tokenizer.json, a tiktoken_encoding in tokenizer_config.json, or a tokenizer.model ranks file)`,
  );
}
