// One turn of a response: its generation on a worker (startGeneration, as chat runs it),
// answered as one Response object or as the event stream: created, in_progress, the output item
// and its part, the text deltas, their done events, then completed or incomplete; or, after an
// error once events went out, an error event and failed. Nothing is sent before the first output,
// so an error the worker reports before it is answered plainly by the caller (an HTTP status, or
// a lone WebSocket error event). A stream whose client lets more than maxBufferedBytes pile up
// unsent is cancelled, so a slow reader costs a bounded amount of memory.
import { ApiError } from '../../errors.ts';
import { startGeneration, type Generation, type GenerationFinish, type TokenLogprob } from '../../generation.ts';
import type { GatewayMetrics } from '../../metrics.ts';
import { chatLogprobsOf } from '../logprobs.ts';
import { assistantMessage } from './conversation.ts';
import {
  type EventSink, outputMessage, outputText, ResponseEventWriter, responseObject, responseUsageOf, type TokenLogprobJson,
} from './objects.ts';
import { newItemId, type PreparedTurn } from './prepare.ts';
import type { StoredResponse } from './store.ts';

export type TurnOutcome =
  /** The response reached completed, incomplete or failed; stored is what a later turn continues from. */
  | { kind: 'done'; stored: StoredResponse }
  /** Failed before anything was sent: the caller answers with the error itself. */
  | { kind: 'rejected'; error: ApiError }
  /** Ended early by cancel(), or (error set, its event already sent) because the client read too slowly. */
  | { kind: 'cancelled'; error: ApiError | null };

export interface Turn {
  readonly outcome: Promise<TurnOutcome>;
  /** Ends the turn and aborts its worker request at once; nothing more is sent. */
  cancel(): void;
}

export interface TurnOptions {
  /** Null: not streamed; the outcome carries the whole Response object. */
  sink: EventSink | null;
  maxBufferedBytes: number;
  metrics: GatewayMetrics;
}

export function startTurn(prepared: PreparedTurn, options: TurnOptions): Turn {
  const { echo, model, isWarmUp } = prepared;
  const { sink, maxBufferedBytes } = options;
  const itemId = newItemId();
  const events = sink === null ? null : new ResponseEventWriter(sink, itemId);
  const logprobs: TokenLogprobJson[] | null = prepared.generation.wantsLogprobs ? [] : null;
  let text = '';
  let isOpen = false;
  let isEnded = false;
  let generation: Generation | null = null;
  let resolveOutcome!: (outcome: TurnOutcome) => void;
  const outcome = new Promise<TurnOutcome>((resolve) => {
    resolveOutcome = resolve;
  });

  const end = (result: TurnOutcome) => {
    isEnded = true;
    resolveOutcome(result);
  };
  /** Log-probabilities of new tokens, kept for the done events and the Response; null without them. */
  const takeLogprobs = (entries: TokenLogprob[] | null): TokenLogprobJson[] | null => {
    if (logprobs === null || entries === null) return null;
    const json = chatLogprobsOf(model.tokenizer, entries).content;
    logprobs.push(...json);
    return json;
  };
  const open = () => {
    if (isOpen || events === null) return;
    isOpen = true;
    const response = responseObject(echo, { status: 'in_progress', output: [], usage: null });
    events.event('response.created', { response });
    events.event('response.in_progress', { response });
    if (isWarmUp) return;
    events.event('response.output_item.added', { output_index: 0, item: outputMessage(itemId, 'in_progress', []) });
    events.event('response.content_part.added', { item_id: itemId, output_index: 0, content_index: 0, part: outputText('', []) });
  };
  /** An answer, even an empty one, keeps the turns alternating; a failure before any text added nothing. */
  const conversationAfter = (isFailed: boolean) =>
    isWarmUp || (isFailed && text === '') ? prepared.messages : [...prepared.messages, assistantMessage(text)];

  const onText = (delta: string, entries: TokenLogprob[] | null) => {
    if (isEnded || isWarmUp) return;
    text += delta;
    const json = takeLogprobs(entries);
    if (events === null) return;
    open();
    events.delta(delta, json === null ? '[]' : JSON.stringify(json));
    const numBufferedBytes = sink!.numBufferedBytes();
    if (numBufferedBytes > maxBufferedBytes) {
      const error = new ApiError(
        'client_too_slow',
        `The client read the stream too slowly: ${numBufferedBytes} bytes were waiting to be sent, over the ` +
          `${maxBufferedBytes}-byte limit, so the response was cancelled.`,
      );
      generation?.abort();
      events.error(error);
      end({ kind: 'cancelled', error });
    }
  };

  const onFinish = (finish: GenerationFinish) => {
    if (isEnded) return;
    takeLogprobs(finish.tokenLogprobs);
    const status = !isWarmUp && finish.finishReason === 'length' ? 'incomplete' : 'completed';
    const usage = responseUsageOf(finish.usage, isWarmUp ? 0 : finish.usage.completion_tokens);
    const message = outputMessage(itemId, status, [outputText(text, logprobs ?? [])]);
    const response = responseObject(echo, { status, output: isWarmUp ? [] : [message], usage });
    if (events !== null) {
      open();
      if (!isWarmUp) {
        const where = { item_id: itemId, output_index: 0, content_index: 0 };
        events.event('response.output_text.done', { ...where, text, logprobs: logprobs ?? [] });
        events.event('response.content_part.done', { ...where, part: message.content[0] });
        events.event('response.output_item.done', { output_index: 0, item: message });
      }
      events.event(status === 'incomplete' ? 'response.incomplete' : 'response.completed', { response });
    }
    end({ kind: 'done', stored: { response, messages: conversationAfter(false) } });
  };

  const onError = (error: ApiError) => {
    if (isEnded) return;
    if (events === null || !isOpen) {
      end({ kind: 'rejected', error });
      return;
    }
    events.error(error);
    const output = text === '' ? [] : [outputMessage(itemId, 'incomplete', [outputText(text, logprobs ?? [])])];
    const response = responseObject(echo, { status: 'failed', output, usage: null, error });
    events.event('response.failed', { response });
    end({ kind: 'done', stored: { response, messages: conversationAfter(true) } });
  };

  try {
    generation = startGeneration(prepared.generation, { onText, onFinish, onError }, options.metrics);
  } catch (err) {
    onError(err instanceof ApiError ? err : new ApiError('engine_unavailable', 'No worker could take the request.'));
  }

  return {
    outcome,
    cancel() {
      if (isEnded) return;
      generation?.abort();
      end({ kind: 'cancelled', error: null });
    },
  };
}
