// The Responses API's objects and stream events, in OpenAI's shapes (the SDK's
// resources/responses/responses.d.ts). A turn answers with output items in the order the model
// wrote them: a reasoning item (a reasoning model's thinking), a message holding one output_text
// part, function calls. The per-token text delta event is a template filled in with the sequence
// number and the text: the hot path stringifies a short string, not an object tree.
import { type ApiError, toResponsesErrorEvent } from '../../errors.ts';
import type { Usage } from '../../generation.ts';
import type { ChatLogprobs } from '../logprobs.ts';

export type ResponseStatus = 'in_progress' | 'completed' | 'incomplete' | 'failed';
export type TokenLogprobJson = ChatLogprobs['content'][number];

export interface OutputText {
  type: 'output_text';
  text: string;
  annotations: never[];
  logprobs: TokenLogprobJson[];
}

export type ItemStatus = 'in_progress' | 'completed' | 'incomplete';

export interface OutputMessage {
  id: string;
  type: 'message';
  status: ItemStatus;
  role: 'assistant';
  content: OutputText[];
}

export interface FunctionCallItem {
  id: string;
  type: 'function_call';
  status: ItemStatus;
  call_id: string;
  name: string;
  arguments: string;
}

export interface ReasoningItem {
  id: string;
  type: 'reasoning';
  status: ItemStatus;
  summary: never[];
  content: Array<{ type: 'reasoning_text'; text: string }>;
}

export type OutputItem = OutputMessage | FunctionCallItem | ReasoningItem;

export interface ResponseUsage {
  input_tokens: number;
  input_tokens_details: { cached_tokens: number };
  output_tokens: number;
  output_tokens_details: { reasoning_tokens: number };
  total_tokens: number;
}

/** What a response echoes of its request; fixed for its whole life. */
export interface ResponseEcho {
  id: string;
  createdAtSec: number;
  model: string;
  instructions: string | null;
  maxOutputTokens: number | null;
  truncation: 'auto' | 'disabled';
  previousResponseId: string | null;
  store: boolean;
  /** Null: the model's own default (its generation_config), which the gateway does not know. */
  temperature: number | null;
  topP: number | null;
  topLogprobs: number;
  toolChoice: ToolChoiceJson;
  /** The request's function tools, as given. */
  tools: object[];
  parallelToolCalls: boolean;
  textFormat: object;
  user: string | null;
  metadata: Readonly<Record<string, string>>;
}

export type ToolChoiceJson = 'auto' | 'none' | 'required' | { type: 'function'; name: string };

export interface ResponseObject {
  id: string;
  object: 'response';
  created_at: number;
  status: ResponseStatus;
  background: false;
  error: { code: string; message: string } | null;
  incomplete_details: { reason: 'max_output_tokens' } | null;
  instructions: string | null;
  max_output_tokens: number | null;
  max_tool_calls: null;
  model: string;
  output: OutputItem[];
  parallel_tool_calls: boolean;
  previous_response_id: string | null;
  reasoning: { effort: null; summary: null };
  service_tier: 'default';
  store: boolean;
  temperature: number | null;
  text: { format: object };
  tool_choice: ToolChoiceJson;
  tools: object[];
  top_logprobs: number;
  top_p: number | null;
  truncation: 'auto' | 'disabled';
  usage: ResponseUsage | null;
  user: string | null;
  metadata: Readonly<Record<string, string>>;
}

export interface ResponseState {
  status: ResponseStatus;
  output: OutputItem[];
  usage: ResponseUsage | null;
  error?: ApiError;
}

export function responseObject(echo: ResponseEcho, state: ResponseState): ResponseObject {
  return {
    id: echo.id,
    object: 'response',
    created_at: echo.createdAtSec,
    status: state.status,
    background: false,
    // OpenAI's ResponseError codes: a failure of the server is server_error; the catalogue's code otherwise.
    error: state.error === undefined ? null : { code: state.error.httpStatus >= 500 ? 'server_error' : state.error.code, message: state.error.message },
    incomplete_details: state.status === 'incomplete' ? { reason: 'max_output_tokens' } : null,
    instructions: echo.instructions,
    max_output_tokens: echo.maxOutputTokens,
    max_tool_calls: null,
    model: echo.model,
    output: state.output,
    parallel_tool_calls: echo.parallelToolCalls,
    previous_response_id: echo.previousResponseId,
    reasoning: { effort: null, summary: null },
    service_tier: 'default',
    store: echo.store,
    temperature: echo.temperature,
    text: { format: echo.textFormat },
    tool_choice: echo.toolChoice,
    tools: echo.tools,
    top_logprobs: echo.topLogprobs,
    top_p: echo.topP,
    truncation: echo.truncation,
    usage: state.usage,
    user: echo.user,
    metadata: echo.metadata,
  };
}

/** numOutputTokens apart from usage: a warm-up's one generated token is discarded, not output. */
export function responseUsageOf(usage: Usage, numOutputTokens: number, numReasoningTokens = 0): ResponseUsage {
  return {
    input_tokens: usage.prompt_tokens,
    input_tokens_details: { cached_tokens: usage.prompt_tokens_details.cached_tokens },
    output_tokens: numOutputTokens,
    output_tokens_details: { reasoning_tokens: numReasoningTokens },
    total_tokens: usage.prompt_tokens + numOutputTokens,
  };
}

export function outputMessage(id: string, status: OutputMessage['status'], content: OutputText[]): OutputMessage {
  return { id, type: 'message', status, role: 'assistant', content };
}

export function outputText(text: string, logprobs: TokenLogprobJson[]): OutputText {
  return { type: 'output_text', text, annotations: [], logprobs };
}

export function functionCallItem(id: string, status: ItemStatus, callId: string, name: string, args: string): FunctionCallItem {
  return { id, type: 'function_call', status, call_id: callId, name, arguments: args };
}

export function reasoningItem(id: string, status: ItemStatus, text: string | null): ReasoningItem {
  return { id, type: 'reasoning', status, summary: [], content: text === null ? [] : [{ type: 'reasoning_text', text }] };
}

/** Where a streamed response's events go: an SSE body or a WebSocket. */
export interface EventSink {
  /**
   * One event: type is its `type` (SSE's event line), json its whole serialized body. onFlushed,
   * when given, is called once the event has left the process's buffers (for the kernel), or
   * with an error if the connection went first.
   */
  send(type: string, json: string, onFlushed?: (error?: Error | null) => void): void;
  /** Bytes sent but not yet taken by the client; a slow reader grows this. */
  numBufferedBytes(): number;
}

const DELTA = 'response.output_text.delta';

/** Writes one response's events to a sink, numbering them from 0. */
export class ResponseEventWriter {
  private readonly sink: EventSink;
  private sequenceNumber = 0;
  /** The delta event around its two variable parts. */
  private readonly deltaHead = `{"type":"${DELTA}","sequence_number":`;
  private deltaMiddle = '';

  constructor(sink: EventSink) {
    this.sink = sink;
  }

  /** body: the event's fields besides type and sequence_number; onFlushed as EventSink.send's. */
  event(type: string, body: object, onFlushed?: (error?: Error | null) => void) {
    this.sink.send(type, JSON.stringify({ type, sequence_number: this.sequenceNumber++, ...body }), onFlushed);
  }

  /** The message whose text the next delta() events extend. */
  textItem(itemId: string, outputIndex: number) {
    this.deltaMiddle = `,"item_id":${JSON.stringify(itemId)},"output_index":${outputIndex},"content_index":0,"delta":`;
  }

  /** logprobsJson: the serialized array of the delta's tokens ("[]" without logprobs). */
  delta(text: string, logprobsJson: string) {
    this.sink.send(DELTA, `${this.deltaHead}${this.sequenceNumber++}${this.deltaMiddle}${JSON.stringify(text)},"logprobs":${logprobsJson}}`);
  }

  error(error: ApiError) {
    this.sink.send('error', toResponsesErrorEvent(error, this.sequenceNumber++));
  }
}
