// The Responses API's truncation "auto": when the conversation (the previous_response_id chain
// and this turn's input) does not fit the context with room for the reply, its oldest items are
// dropped until it does. Whole exchanges go: the kept part starts at a user message, so
// templates that insist on user-first alternation still render it, and no tool result is left
// without its call. System messages stay wherever they are.
import { ApiError } from '../../errors.ts';
import type { ChatMessage } from '../../tokenizer/chat-template.ts';

/** Encodes the kept messages, throwing an ApiError (context_length_exceeded among others). */
export type EncodeMessages = (messages: readonly ChatMessage[]) => Promise<number[]>;

export interface FittedPrompt {
  promptTokenIds: number[];
  /** Messages left out, oldest first (0: the whole conversation fitted). */
  numDroppedMessages: number;
}

/** The conversation from `start` on, with the system messages before it. */
function keptFrom(messages: readonly ChatMessage[], start: number): ChatMessage[] {
  return [...messages.slice(0, start).filter((message) => message.role === 'system'), ...messages.slice(start)];
}

/**
 * The longest recent part of `messages` whose prompt leaves `numReplyTokens` of the
 * `maxModelLen` context: the whole when it fits (one encoding), else a binary search over the
 * user messages it may start at (a few encodings, each of a shorter prompt). When even the last
 * exchange does not fit, that one is encoded for the caller to refuse as it would untruncated.
 */
export async function fitConversation(
  messages: readonly ChatMessage[],
  encode: EncodeMessages,
  maxModelLen: number,
  numReplyTokens: number,
): Promise<FittedPrompt> {
  const starts = [0, ...messages.flatMap((message, index) => (index > 0 && message.role === 'user' ? [index] : []))];
  const fitting = async (start: number): Promise<number[] | null> => {
    try {
      const promptTokenIds = await encode(keptFrom(messages, start));
      return promptTokenIds.length + numReplyTokens <= maxModelLen ? promptTokenIds : null;
    } catch (err) {
      // Refused by its length before tokenizing: it does not fit either.
      if (err instanceof ApiError && err.code === 'context_length_exceeded') return null;
      throw err;
    }
  };
  const whole = await fitting(0);
  if (whole !== null) return { promptTokenIds: whole, numDroppedMessages: 0 };
  // starts[lo] does not fit; find the first of starts (lo, hi] that does, if any.
  let lo = 0;
  let hi = starts.length - 1;
  let best: FittedPrompt | null = null;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    const promptTokenIds = await fitting(starts[mid]);
    if (promptTokenIds === null) {
      lo = mid;
    } else {
      best = { promptTokenIds, numDroppedMessages: numDroppedBefore(messages, starts[mid]) };
      hi = mid - 1;
    }
  }
  // The search narrowed from above: the best start found is the earliest that fits.
  if (best !== null) return best;
  const last = starts.at(-1)!;
  return { promptTokenIds: await encode(keptFrom(messages, last)), numDroppedMessages: numDroppedBefore(messages, last) };
}

function numDroppedBefore(messages: readonly ChatMessage[], start: number): number {
  return messages.length - keptFrom(messages, start).length;
}
