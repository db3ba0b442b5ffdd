// One turn of a response: its generation on a worker (startGeneration, as chat runs it),
// answered as one Response object or as the event stream: created, in_progress, the output item
// and its part, the text deltas, their done events, then completed or incomplete; or, after an
// error once events went out, an error event and failed. Nothing is sent before the first output,
// so an error the worker reports before it is answered plainly by the caller (an HTTP status, or
// a lone WebSocket error event). A stream whose client lets more than maxBufferedBytes pile up
// unsent is cancelled (its generation aborted in the worker), so a slow reader costs a bounded
// amount of memory; the closing events, which repeat the whole text and its log-probabilities
// (megabytes with top_logprobs), go one at a time as the reader takes them, and a reader that
// takes nothing for a grace period (10 s) is cut. Log-probabilities are kept as typed arrays.
import { ApiError } from '../../errors.ts';
import { startGeneration, type Generation, type GenerationFinish, type TokenLogprob } from '../../generation.ts';
import type { GatewayMetrics } from '../../metrics.ts';
import { chatLogprobsOf } from '../logprobs.ts';
import { LogprobsRecorder, logprobsJsonOf } from './compact-logprobs.ts';
import { assistantMessage } from './conversation.ts';
import {
  type EventSink, outputMessage, outputText, ResponseEventWriter, responseObject, responseUsageOf,
  type ResponseState, type ResponseStatus, type TokenLogprobJson,
} from './objects.ts';
import { newItemId, type PreparedTurn } from './prepare.ts';
import { responseObjectOf, type StoredResponse } from './store.ts';

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
  /** How long a reader may take nothing while the closing events wait for room, before it is cut. */
  slowReaderGraceMs: number;
  metrics: GatewayMetrics;
}

export function startTurn(prepared: PreparedTurn, options: TurnOptions): Turn {
  const { echo, model, isWarmUp } = prepared;
  const { sink, maxBufferedBytes, slowReaderGraceMs } = options;
  const itemId = newItemId();
  const events = sink === null ? null : new ResponseEventWriter(sink, itemId);
  const logprobs = prepared.generation.wantsLogprobs ? new LogprobsRecorder(model.tokenizer) : null;
  let text = '';
  let isOpen = false;
  let isEnded = false;
  let generation: Generation | null = null;
  /** Set while the closing events wait for the reader: cancel() stops them. */
  let stopClosingEvents: (() => void) | null = null;
  let resolveOutcome!: (outcome: TurnOutcome) => void;
  const outcome = new Promise<TurnOutcome>((resolve) => {
    resolveOutcome = resolve;
  });

  const end = (result: TurnOutcome) => {
    isEnded = true;
    resolveOutcome(result);
  };
  const tooSlow = (numBufferedBytes: number) => new ApiError(
    'client_too_slow',
    `The client read the stream too slowly: ${numBufferedBytes} bytes were waiting to be sent, over the ` +
      `${maxBufferedBytes}-byte limit, so the response was cancelled.`,
  );
  /** Keeps new tokens' log-probabilities; their JSON for the delta event, or null without them. */
  const takeLogprobs = (entries: TokenLogprob[] | null): TokenLogprobJson[] | null => {
    if (logprobs === null || entries === null) return null;
    logprobs.push(entries);
    return events === null ? null : chatLogprobsOf(model.tokenizer, entries).content;
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
  /** What the store keeps: the response without its log-probabilities' JSON, and them as typed arrays. */
  const storedOf = (
    status: ResponseStatus, state: Pick<ResponseState, 'usage' | 'error'>, messageStatus: 'completed' | 'incomplete' | null,
  ): StoredResponse => ({
    response: responseObject(echo, {
      ...state, status, output: messageStatus === null ? [] : [outputMessage(itemId, messageStatus, [outputText(text, [])])],
    }),
    messages: conversationAfter(status === 'failed'),
    logprobs: logprobs === null ? null : logprobs.build(),
  });

  /**
   * Writes events one at a time: the next once the backlog is under the bound (or the previous
   * event has left), so the closing events never pile up more than one of them past it. A reader
   * that takes nothing for slowReaderGraceMs is cut with client_too_slow.
   */
  const writePaced = (pending: [type: string, body: object][], onWritten: () => void) => {
    let timer: NodeJS.Timeout | null = null;
    let isStopped = false;
    stopClosingEvents = () => {
      isStopped = true;
      if (timer !== null) clearTimeout(timer);
    };
    const writeNext = () => {
      while (!isStopped && pending.length > 0) {
        const [type, body] = pending.shift()!;
        let isFlushed = false;
        let isWaiting = false;
        events!.event(type, body, (error) => {
          isFlushed = true;
          if (!isWaiting || isStopped) return;
          clearTimeout(timer!);
          timer = null;
          if (!error) {
            writeNext();
            return;
          }
          // The connection went first: no one is left to write to.
          isStopped = true;
          end({ kind: 'cancelled', error: null });
        });
        if (pending.length === 0 || isFlushed) continue;
        const numBufferedBytes = sink!.numBufferedBytes();
        if (numBufferedBytes <= maxBufferedBytes) continue;
        isWaiting = true;
        timer = setTimeout(() => {
          isStopped = true;
          const error = tooSlow(sink!.numBufferedBytes());
          events!.error(error);
          end({ kind: 'cancelled', error });
        }, slowReaderGraceMs);
        return;
      }
      if (isStopped) return;
      stopClosingEvents = null;
      onWritten();
    };
    writeNext();
  };

  const onText = (delta: string, entries: TokenLogprob[] | null) => {
    if (isEnded || isWarmUp) return;
    text += delta;
    const json = takeLogprobs(entries);
    if (events === null) return;
    open();
    events.delta(delta, json === null ? '[]' : JSON.stringify(json));
    const numBufferedBytes = sink!.numBufferedBytes();
    if (numBufferedBytes > maxBufferedBytes) {
      const error = tooSlow(numBufferedBytes);
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
    const stored = storedOf(status, { usage }, isWarmUp ? null : status);
    if (events === null) {
      end({ kind: 'done', stored });
      return;
    }
    // The closing events repeat the whole output with its log-probabilities, made once here.
    const logprobsJson = stored.logprobs === null ? [] : logprobsJsonOf(stored.logprobs);
    const message = outputMessage(itemId, status, [outputText(text, logprobsJson)]);
    const response = responseObject(echo, { status, output: isWarmUp ? [] : [message], usage });
    open();
    const where = { item_id: itemId, output_index: 0, content_index: 0 };
    const closing: [string, object][] = isWarmUp ? [] : [
      ['response.output_text.done', { ...where, text, logprobs: logprobsJson }],
      ['response.content_part.done', { ...where, part: message.content[0] }],
      ['response.output_item.done', { output_index: 0, item: message }],
    ];
    closing.push([status === 'incomplete' ? 'response.incomplete' : 'response.completed', { response }]);
    // The generation is over: from here on only the reader's pace matters.
    isEnded = true;
    writePaced(closing, () => resolveOutcome({ kind: 'done', stored }));
  };

  const onError = (error: ApiError) => {
    if (isEnded) return;
    if (events === null || !isOpen) {
      end({ kind: 'rejected', error });
      return;
    }
    events.error(error);
    const stored = storedOf('failed', { usage: null, error }, text === '' ? null : 'incomplete');
    const failed = stored.logprobs === null ? stored.response : responseObjectOf(stored);
    events.event('response.failed', { response: failed });
    end({ kind: 'done', stored });
  };

  try {
    generation = startGeneration(prepared.generation, { onText, onFinish, onError }, options.metrics);
  } catch (err) {
    onError(err instanceof ApiError ? err : new ApiError('engine_unavailable', 'No worker could take the request.'));
  }

  return {
    outcome,
    cancel() {
      if (stopClosingEvents !== null) {
        stopClosingEvents();
        stopClosingEvents = null;
        resolveOutcome({ kind: 'cancelled', error: null });
        return;
      }
      if (isEnded) return;
      generation?.abort();
      end({ kind: 'cancelled', error: null });
    },
  };
}
