// The work a worker thread does for the event loop, as plain data in and out. Each job runs the
// same function the loop runs on small inputs, so an answer never depends on where it was made.
import { parseJsonBody } from '../json-body.ts';
import { loadChatTemplate } from '../tokenizer/chat-template.ts';
import type { ChatMessage, TemplateInputs } from '../tokenizer/chat-template.ts';
import { loadTokenizer } from '../tokenizer/load.ts';
import { encodeChat, encodePrompt, type PromptModel } from '../tokenizer/prompt.ts';

/** A served model as a thread finds it: it loads the checkpoint's tokenizer itself, once. */
export interface ModelRef {
  name: string;
  modelDir: string;
  maxModelLen: number;
}

export type Job =
  | { kind: 'parseJson'; bytes: Uint8Array }
  /** The text as UTF-8, a buffer the thread takes over: cheaper to move than the string. */
  | { kind: 'encodePrompt'; model: ModelRef; textBytes: Uint8Array; addSpecialTokens: boolean; fitContext: boolean }
  | {
      kind: 'encodeChat';
      model: ModelRef;
      messages: ChatMessage[];
      addGenerationPrompt: boolean;
      param: string;
      fitContext: boolean;
      inputs: TemplateInputs;
    };

export interface JobResults {
  parseJson: unknown;
  encodePrompt: Uint32Array;
  encodeChat: Uint32Array;
}

/**
 * Microseconds the job should take, as measured here: about 10 ns per body byte to decode and
 * parse, 1 µs per UTF-8 byte to tokenize (Hugging Face tokenizers; tiktoken is faster), 20 µs
 * per message to render a chat template. The pool runs the cheapest waiting job first.
 */
export function estimatedCostUs(job: Job): number {
  switch (job.kind) {
    case 'parseJson':
      return job.bytes.length / 100;
    case 'encodePrompt':
      return job.textBytes.length;
    case 'encodeChat':
      return job.messages.reduce((sum, message) => sum + message.content.length + 20, 0);
  }
}

const decoder = new TextDecoder();

const promptModels = new Map<string, Omit<PromptModel, 'name' | 'maxModelLen'>>();

function promptModelOf(ref: ModelRef): PromptModel {
  let loaded = promptModels.get(ref.modelDir);
  if (loaded === undefined) {
    const { tokenizer, config } = loadTokenizer(ref.modelDir);
    loaded = { tokenizer, chatTemplate: loadChatTemplate(config) };
    promptModels.set(ref.modelDir, loaded);
  }
  return { ...loaded, name: ref.name, maxModelLen: ref.maxModelLen };
}

export interface JobOutcome {
  value: unknown;
  /** Buffers that move to the loop instead of being copied. */
  transfer: ArrayBuffer[];
}

/** Runs in the thread; throws the same ApiErrors the loop would. */
export function runJob(job: Job): JobOutcome {
  switch (job.kind) {
    case 'parseJson':
      return { value: parseJsonBody(job.bytes), transfer: [] };
    case 'encodePrompt':
      return tokenIdsOutcome(encodePrompt(promptModelOf(job.model), decoder.decode(job.textBytes), job.addSpecialTokens, job.fitContext));
    case 'encodeChat':
      return tokenIdsOutcome(encodeChat(promptModelOf(job.model), job.messages, job.addGenerationPrompt, job.param, job.fitContext, job.inputs));
  }
}

function tokenIdsOutcome(tokenIds: number[]): JobOutcome {
  const value = Uint32Array.from(tokenIds);
  return { value, transfer: [value.buffer] };
}
