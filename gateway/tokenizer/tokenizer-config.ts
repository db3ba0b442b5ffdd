// Reads the parts of a checkpoint's tokenizer_config.json (and chat_template.jinja) that
// every tokenizer backend shares: special tokens, BOS policy, chat template.
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';

export interface AddedToken {
  id: number;
  content: string;
  special: boolean;
}

export interface TokenizerConfig {
  /** The file as parsed, for libraries that read more of it. */
  raw: Record<string, unknown>;
  bosToken: string | null;
  eosToken: string | null;
  addBosToken: boolean;
  /** From added_tokens_decoder, in id order. */
  addedTokens: AddedToken[];
  chatTemplate: string | null;
  /** Conduit's key for tokenizer-less checkpoints: a tiktoken encoding such as "gpt2". */
  tiktokenEncoding: string | null;
}

/** Token fields are either a string or a serialized AddedToken ({ content, ... }). */
function tokenContent(value: unknown): string | null {
  if (typeof value === 'string') return value;
  if (value !== null && typeof value === 'object' && typeof (value as { content?: unknown }).content === 'string') {
    return (value as { content: string }).content;
  }
  return null;
}

/** A string, or a list of named templates of which "default" is the one for plain chat. */
function selectChatTemplate(value: unknown): string | null {
  if (typeof value === 'string') return value;
  if (!Array.isArray(value)) return null;
  const named = value.filter(
    (entry): entry is { name: string; template: string } =>
      entry !== null && typeof entry === 'object' && typeof entry.name === 'string' && typeof entry.template === 'string',
  );
  return (named.find((entry) => entry.name === 'default') ?? named[0])?.template ?? null;
}

function readAddedTokens(value: unknown, file: string): AddedToken[] {
  if (value === undefined || value === null) return [];
  if (typeof value !== 'object') throw new Error(`${file}: added_tokens_decoder must be an object`);
  const tokens: AddedToken[] = [];
  for (const [key, entry] of Object.entries(value as Record<string, unknown>)) {
    const id = Number(key);
    const content = tokenContent(entry);
    if (!Number.isInteger(id) || id < 0 || content === null) {
      throw new Error(`${file}: added_tokens_decoder["${key}"] needs an integer id and a content string`);
    }
    tokens.push({ id, content, special: (entry as { special?: unknown }).special === true });
  }
  return tokens.sort((a, b) => a.id - b.id);
}

export function readTokenizerConfig(modelDir: string): TokenizerConfig {
  const file = path.join(modelDir, 'tokenizer_config.json');
  const raw: Record<string, unknown> = existsSync(file) ? JSON.parse(readFileSync(file, 'utf8')) : {};
  const templateFile = path.join(modelDir, 'chat_template.jinja');
  const chatTemplate =
    selectChatTemplate(raw.chat_template) ?? (existsSync(templateFile) ? readFileSync(templateFile, 'utf8') : null);
  return {
    raw,
    bosToken: tokenContent(raw.bos_token),
    eosToken: tokenContent(raw.eos_token),
    addBosToken: raw.add_bos_token === true,
    addedTokens: readAddedTokens(raw.added_tokens_decoder, file),
    chatTemplate,
    tiktokenEncoding: typeof raw.tiktoken_encoding === 'string' ? raw.tiktoken_encoding : null,
  };
}
