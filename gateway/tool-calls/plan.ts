// What one generation's output is, given its model, its prompt and the request: the grammar the
// worker holds it to (a response format, or forced tool calls, after any think section) and how
// the gateway splits it (reasoning, content, calls). Shared by chat and the Responses API.
import type { StructuredConstraint, StructuredOutput } from '../../engine/types.ts';
import type { RegisteredModel } from '../served-model.ts';
import { CALL_SYNTAX, reasoningStateOf } from './families.ts';
import type { OutputParserOptions } from './output-parser.ts';
import type { Tokenizer } from '../tokenizer/tokenizer.ts';
import { MISTRAL_MARKER, toolCallConstraint, type ToolPlan } from './tools.ts';

export interface OutputPlan {
  structuredOutput: StructuredOutput | undefined;
  parser: OutputParserOptions;
  /** The finish reason of an output that made calls: a named tool_choice ends with stop, as OpenAI's does. */
  callsFinishReason: 'tool_calls' | 'stop';
}

/** Mistral's marker as this tokenizer has it: one special token, or text. */
function markerTokenOf(tokenizer: Tokenizer): { isSpecial: true; tokenId: number } | { isSpecial: false } {
  const tokenIds = tokenizer.encode(MISTRAL_MARKER, { addSpecialTokens: false });
  return tokenIds.length === 1 && tokenizer.specialTokenIds.has(tokenIds[0]) ? { isSpecial: true, tokenId: tokenIds[0] } : { isSpecial: false };
}

/** Enough of the prompt's end to see a think tag the template wrote. */
const PROMPT_TAIL_TOKENS = 16;

export function planOutput(
  model: RegisteredModel,
  promptTokenIds: readonly number[],
  tools: ToolPlan,
  constraint: StructuredConstraint | null,
  wantsLogprobs: boolean,
): OutputPlan {
  const { formats } = model;
  const tail = model.tokenizer.decode(promptTokenIds.slice(-PROMPT_TAIL_TOKENS), { skipSpecialTokens: false });
  const reasoningState = formats.reasoning === null ? 'none' : reasoningStateOf(tail, formats.reasoning);
  const offersTools = tools.choice !== 'none' && tools.tools.length > 0;
  const forcesCalls = offersTools && tools.choice !== 'auto';
  const constrainAfter = formats.reasoning !== null && reasoningState !== 'closed' ? formats.reasoning.end : null;
  // Mistral's forced calls begin with its marker, as the model's own: a special token is output
  // first (the grammar cannot spell it), unless a think section comes first (the calls then begin
  // with the bare array, which the parser also takes); a marker that is plain text is spelled.
  const marker = forcesCalls && formats.toolCalls === 'mistral' ? markerTokenOf(model.tokenizer) : null;
  const prefixTokenIds = marker !== null && marker.isSpecial && constrainAfter === null ? [marker.tokenId] : null;
  // Forced calls outrank a response format; under auto a response format leaves no room for calls.
  const chosen =
    forcesCalls || constraint === null ? (offersTools ? toolCallConstraint(formats.toolCalls, tools, marker !== null && !marker.isSpecial) : null) : constraint;
  const structuredOutput: StructuredOutput | undefined =
    chosen === null
      ? undefined
      : {
          constraint: chosen,
          ...(constrainAfter !== null ? { constrainAfter } : {}),
          jumpForward: !wantsLogprobs,
          ...(prefixTokenIds !== null ? { prefixTokenIds } : {}),
        };
  return {
    structuredOutput,
    parser: { reasoning: formats.reasoning, reasoningState, toolCalls: offersTools ? CALL_SYNTAX[formats.toolCalls] : null },
    callsFinishReason: typeof tools.choice === 'object' ? 'stop' : 'tool_calls',
  };
}
