// A checkpoint's tokenizer.json, run by @huggingface/tokenizers.
import { readFileSync } from 'node:fs';
import { Tokenizer as HfTokenizer } from '@huggingface/tokenizers';
import type { Tokenizer } from './tokenizer.ts';
import type { TokenizerConfig } from './tokenizer-config.ts';

class HuggingFaceTokenizer implements Tokenizer {
  readonly vocabSize: number;
  readonly bosTokenId: number | null;
  readonly eosTokenIds: readonly number[];
  readonly specialTokenIds: ReadonlySet<number>;
  private readonly hf: HfTokenizer;

  constructor(hf: HfTokenizer, config: TokenizerConfig) {
    this.hf = hf;
    let maxId = -1;
    for (const id of hf.get_vocab(true).values()) maxId = Math.max(maxId, id);
    this.vocabSize = maxId + 1;
    const idOf = (content: string | null) => (content === null ? undefined : hf.token_to_id(content));
    this.bosTokenId = idOf(config.bosToken) ?? null;
    const eosTokenId = idOf(config.eosToken);
    this.eosTokenIds = eosTokenId === undefined ? [] : [eosTokenId];
    const specialTokenIds = new Set<number>();
    for (const [id, token] of hf.get_added_tokens_decoder()) if (token.special) specialTokenIds.add(id);
    this.specialTokenIds = specialTokenIds;
  }

  encode(text: string, options: { addSpecialTokens: boolean }): number[] {
    return this.hf.encode(text, { add_special_tokens: options.addSpecialTokens }).ids;
  }

  decode(tokenIds: readonly number[], options: { skipSpecialTokens: boolean }): string {
    const knownIds = tokenIds.filter((id) => id >= 0 && id < this.vocabSize);
    // Clean-up rewrites text already streamed (" ." -> "."), so incremental decoding turns it off.
    return this.hf.decode(knownIds, { skip_special_tokens: options.skipSpecialTokens, clean_up_tokenization_spaces: false });
  }
}

export function loadHuggingFaceTokenizer(file: string, config: TokenizerConfig): Tokenizer {
  const json = JSON.parse(readFileSync(file, 'utf8'));
  return new HuggingFaceTokenizer(new HfTokenizer(json, config.raw), config);
}
