// Writes models/conduit-tiny/, the model `npm start` serves: a small Llama with random weights
// (until the training issue lands) and tiktoken's gpt2 encoding as its tokenizer. The output
// is deterministic, so the committed files can be checked against a fresh run.
//
//   node --import tsx tools/make-default-model.ts [--out models/conduit-tiny]
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { DEFAULT_OPTIONS, PyFloat, toPythonJson, writeRandomCheckpoint, type CheckpointOptions } from './make-checkpoint.ts';

export const DEFAULT_MODEL_DIR = fileURLToPath(new URL('../models/conduit-tiny', import.meta.url));

/** gpt2's only special token ends documents and doubles as bos and eos. */
const END_OF_TEXT = '<|endoftext|>';
const END_OF_TEXT_ID = 50256;
const GPT2_VOCAB_SIZE = 50257;
const MAX_POSITION_EMBEDDINGS = 2048;

/**
 * "<|role|>\n{content}\n" per message, with the assistant's turn closed by <|endoftext|> so a
 * trained model learns to stop; add_generation_prompt opens an assistant turn.
 */
export const CHAT_TEMPLATE =
  "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] }}" +
  `{% if message['role'] == 'assistant' %}{{ '${END_OF_TEXT}' }}{% endif %}{{ '\\n' }}{% endfor %}` +
  "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}";

export function defaultModelOptions(outDir: string): CheckpointOptions {
  return {
    ...DEFAULT_OPTIONS,
    outDir,
    arch: 'llama',
    dtype: 'bf16',
    hiddenSize: 256,
    numLayers: 4,
    numHeads: 4,
    numKvHeads: 2,
    intermediateSize: 704,
    vocabSize: GPT2_VOCAB_SIZE,
    maxPositionEmbeddings: MAX_POSITION_EMBEDDINGS,
    tieWordEmbeddings: true,
    seed: 0,
    bosTokenId: END_OF_TEXT_ID,
    eosTokenId: END_OF_TEXT_ID,
    generationDefaults: {
      temperature: new PyFloat(0.8),
      top_p: new PyFloat(0.95),
      top_k: 50,
      max_new_tokens: 256,
    },
  };
}

/** Standard Hugging Face fields plus `tiktoken_encoding`, which names the encoding our gateway loads. */
export function defaultTokenizerConfig(): Record<string, unknown> {
  return {
    add_bos_token: false,
    add_eos_token: false,
    added_tokens_decoder: {
      [END_OF_TEXT_ID]: { content: END_OF_TEXT, lstrip: false, normalized: false, rstrip: false, single_word: false, special: true },
    },
    bos_token: END_OF_TEXT,
    chat_template: CHAT_TEMPLATE,
    clean_up_tokenization_spaces: false,
    eos_token: END_OF_TEXT,
    model_max_length: MAX_POSITION_EMBEDDINGS,
    pad_token: null,
    tiktoken_encoding: 'gpt2',
    unk_token: END_OF_TEXT,
  };
}

export function writeDefaultModel(outDir: string): void {
  writeRandomCheckpoint(defaultModelOptions(outDir));
  writeFileSync(path.join(outDir, 'tokenizer_config.json'), `${toPythonJson(defaultTokenizerConfig())}\n`);
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(path.resolve(process.argv[1])).href) {
  const { values } = parseArgs({ args: process.argv.slice(2), options: { out: { type: 'string', default: DEFAULT_MODEL_DIR } } });
  writeDefaultModel(values.out);
  console.log(`wrote ${values.out}`);
}
