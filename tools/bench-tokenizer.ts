// A tokenizer for the 125 M benchmark checkpoint (tools/bench-model.ts), whose 32,000 logits had
// none: structured outputs need a vocabulary for their grammar. GPT-2's byte-level BPE
// (tiktoken's bundled gpt2 ranks) cut to its first 31,998 tokens, which is still a whole BPE: a
// merge's two parts always rank below what they make. Ids 1 and 2 are the checkpoint's BOS and
// EOS, special tokens <s> and </s>; the two byte tokens GPT-2 had there (" and #) take ids
// 31998 and 31999. Written as tokenizer.json (with its merges), so the gateway can serve the
// model too.
import { existsSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { get_encoding } from 'tiktoken';

const VOCAB_SIZE = 32000;
const NUM_RANKS = VOCAB_SIZE - 2;
const BOS_ID = 1;
const EOS_ID = 2;

/** GPT-2's byte-level alphabet: every byte as one printable character. */
function byteLevelChars(): string[] {
  const printable: number[] = [];
  for (let b = 33; b <= 126; b++) printable.push(b);
  for (let b = 161; b <= 172; b++) printable.push(b);
  for (let b = 174; b <= 255; b++) printable.push(b);
  let shifted = 0;
  return Array.from({ length: 256 }, (_, b) => String.fromCodePoint(printable.includes(b) ? b : 256 + shifted++));
}

/** The two tokens a rank's bytes split into: BPE over the lower ranks, which ends at exactly two parts. */
function mergeOf(bytes: Uint8Array, rankOf: Map<string, number>, rank: number): [string, string] {
  let parts = Array.from(bytes, (b) => Buffer.from([b]).toString('latin1'));
  while (parts.length > 2) {
    let best = -1;
    let bestRank = Infinity;
    for (let i = 0; i + 1 < parts.length; i++) {
      const merged = rankOf.get(parts[i] + parts[i + 1]);
      if (merged !== undefined && merged < rank && merged < bestRank) {
        best = i;
        bestRank = merged;
      }
    }
    if (best === -1) throw new Error(`rank ${rank}: no merge of lower ranks builds it`);
    parts = [...parts.slice(0, best), parts[best] + parts[best + 1], ...parts.slice(best + 2)];
  }
  return [parts[0], parts[1]];
}

/** Writes tokenizer.json and tokenizer_config.json into the benchmark checkpoint unless present. */
export function ensureBenchTokenizer(modelDir: string): void {
  const file = path.join(modelDir, 'tokenizer.json');
  if (existsSync(file)) return;
  const chars = byteLevelChars();
  const encoding = get_encoding('gpt2');
  const bytesOfRank: Uint8Array[] = [];
  try {
    for (let rank = 0; rank < NUM_RANKS; rank++) bytesOfRank.push(encoding.decode_single_token_bytes(rank));
  } finally {
    encoding.free();
  }
  const rankOf = new Map(bytesOfRank.map((bytes, rank) => [Buffer.from(bytes).toString('latin1'), rank]));
  const textOf = (latin1: string) => Array.from(Buffer.from(latin1, 'latin1'), (b) => chars[b]).join('');
  const idOfRank = (rank: number) => (rank === BOS_ID ? NUM_RANKS : rank === EOS_ID ? NUM_RANKS + 1 : rank);
  const vocab: Record<string, number> = {};
  bytesOfRank.forEach((bytes, rank) => (vocab[textOf(Buffer.from(bytes).toString('latin1'))] = idOfRank(rank)));
  const merges: string[] = [];
  for (let rank = 0; rank < NUM_RANKS; rank++) {
    if (bytesOfRank[rank].length < 2) continue;
    const [left, right] = mergeOf(bytesOfRank[rank], rankOf, rank);
    merges.push(`${textOf(left)} ${textOf(right)}`);
  }
  const special = (id: number, content: string) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
  const byteLevel = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true };
  writeFileSync(
    file,
    JSON.stringify({
      version: '1.0',
      truncation: null,
      padding: null,
      added_tokens: [special(BOS_ID, '<s>'), special(EOS_ID, '</s>')],
      normalizer: null,
      pre_tokenizer: byteLevel,
      post_processor: null,
      decoder: byteLevel,
      model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, vocab, merges },
    }),
  );
  writeFileSync(
    path.join(modelDir, 'tokenizer_config.json'),
    JSON.stringify({
      bos_token: '<s>',
      eos_token: '</s>',
      add_bos_token: false,
      added_tokens_decoder: { [BOS_ID]: { content: '<s>', special: true }, [EOS_ID]: { content: '</s>', special: true } },
      chat_template: "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}",
    }),
  );
}
