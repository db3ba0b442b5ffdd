// One turn of a response: its generation on a worker (startGeneration, as chat runs it),
// answered as one Response object or as the event stream: created, in_progress, then each output
// item as the model writes it (a reasoning item, a message with its text deltas, function calls
// with their argument deltas), each closed by its done events, then completed or incomplete; or,
// after an error once events went out, an error event and failed. The output is split by the
// same parser chat uses (tool-calls/output-parser.ts), so a stream and a Response object agree.
// Nothing is sent before the first output, so an error the worker reports before it is answered
// plainly by the caller (an HTTP status, or a lone WebSocket error event). A stream whose client
// lets more than maxBufferedBytes pile up unsent is cancelled (its generation aborted in the
// worker), so a slow reader costs a bounded amount of memory; the closing events, which repeat the
// whole output and its log-probabilities (megabytes with top_logprobs), go one at a time as the
// reader takes them, and a reader that takes nothing for a grace period (10 s) is cut.
// Log-probabilities are kept as typed arrays.
import { randomUUID } from 'node:crypto';
import { ApiError } from '../../errors.ts';
import { startGeneration, type Generation, type GenerationFinish, type TokenLogprob } from '../../generation.ts';
import type { GatewayMetrics } from '../../metrics.ts';
import { OutputParser, type OutputEvent } from '../../tool-calls/output-parser.ts';
import { chatLogprobsOf } from '../logprobs.ts';
import { LogprobsRecorder, logprobsJsonOf } from './compact-logprobs.ts';
import { assistantMessage } from './conversation.ts';
import {
  type EventSink, functionCallItem, type ItemStatus, type OutputItem, outputMessage, outputText, reasoningItem, ResponseEventWriter,
  responseObject, responseUsageOf, type TokenLogprobJson,
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

/** An output item being written: its place in output, and what it has so far. */
type OpenItem =
  | { kind: 'reasoning'; id: string; outputIndex: number; text: string }
  | { kind: 'message'; id: string; outputIndex: number; text: string }
  | { kind: 'call'; id: string; outputIndex: number; callId: string; name: string; arguments: string };

function newId(prefix: string): string {
  return `${prefix}_${randomUUID().replaceAll('-', '')}`;
}

export function startTurn(prepared: PreparedTurn, options: TurnOptions): Turn {
  const { echo, model, isWarmUp, plan } = prepared;
  const { sink, maxBufferedBytes, slowReaderGraceMs } = options;
  const events = sink === null ? null : new ResponseEventWriter(sink);
  const parser = new OutputParser(plan.parser);
  const logprobs = prepared.generation.wantsLogprobs ? new LogprobsRecorder(model.tokenizer) : null;
  /** Items finished, in output order; current is the one being written. */
  const done: OutputItem[] = [];
  let current: OpenItem | null = null;
  let messageText = '';
  let reasoningText = '';
  const calls: Array<{ id: string; name: string; arguments: string }> = [];
  let isOpen = false;
  let isEnded = false;
  let generation: Generation | null = null;
  /** Set while onFinish gathers the closing events, which then go out at the reader's pace. */
  let closingEvents: [type: string, body: object][] | null = null;
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
  /** An event now, or, while onFinish gathers them, one of the closing events. */
  const emit = (type: string, body: object) => {
    if (closingEvents !== null) closingEvents.push([type, body]);
    else events!.event(type, body);
  };
  const open = () => {
    if (isOpen || events === null) return;
    isOpen = true;
    const response = responseObject(echo, { status: 'in_progress', output: [], usage: null });
    events.event('response.created', { response });
    events.event('response.in_progress', { response });
  };

  /** The finished form of the item being written. */
  const itemOf = (item: OpenItem, status: ItemStatus): OutputItem => {
    switch (item.kind) {
      case 'reasoning':
        return reasoningItem(item.id, status, item.text);
      case 'message':
        // Without log-probabilities: the stored form, which responseObjectOf completes.
        return outputMessage(item.id, status, [outputText(item.text, [])]);
      case 'call':
        return functionCallItem(item.id, status, item.callId, item.name, item.arguments);
    }
  };
  /** Opens an item after the one being written, which is done: its place in output is the next. */
  const startItem = (item: OpenItem) => {
    closeItem('completed');
    item.outputIndex = done.length;
    current = item;
    if (events === null) return;
    const where = { item_id: item.id, output_index: item.outputIndex };
    if (item.kind === 'reasoning') {
      events.event('response.output_item.added', { output_index: item.outputIndex, item: reasoningItem(item.id, 'in_progress', null) });
    } else if (item.kind === 'message') {
      events.event('response.output_item.added', { output_index: item.outputIndex, item: outputMessage(item.id, 'in_progress', []) });
      events.event('response.content_part.added', { ...where, content_index: 0, part: outputText('', []) });
      events.textItem(item.id, item.outputIndex);
    } else {
      events.event('response.output_item.added', { output_index: item.outputIndex, item: functionCallItem(item.id, 'in_progress', item.callId, item.name, '') });
    }
  };
  /**
   * Ends the item being written: its done events (none after an error: the failed response says
   * it all), then it joins the output (a call cut off does not).
   */
  const closeItem = (status: ItemStatus, announce = true) => {
    const item = current;
    if (item === null) return;
    current = null;
    const isCutCall = item.kind === 'call' && status === 'incomplete';
    const finished = itemOf(item, status);
    if (!isCutCall) done.push(finished);
    if (events === null || !announce) return;
    const where = { item_id: item.id, output_index: item.outputIndex };
    let announced = finished;
    if (item.kind === 'reasoning') {
      emit('response.reasoning_text.done', { ...where, content_index: 0, text: item.text });
    } else if (item.kind === 'message') {
      // The turn's log-probabilities so far, made into JSON once for this item's closing events.
      const logprobsJson = logprobs === null ? [] : logprobsJsonOf(logprobs.build());
      const part = outputText(item.text, logprobsJson);
      announced = outputMessage(item.id, status, [part]);
      emit('response.output_text.done', { ...where, content_index: 0, text: item.text, logprobs: logprobsJson });
      emit('response.content_part.done', { ...where, content_index: 0, part });
    } else if (!isCutCall) {
      emit('response.function_call_arguments.done', { ...where, name: item.name, arguments: item.arguments });
    }
    emit('response.output_item.done', { output_index: item.outputIndex, item: announced });
  };
  const apply = (parsed: OutputEvent[], logprobsJson: TokenLogprobJson[] | null) => {
    let logprobsOfText = logprobsJson === null ? '[]' : JSON.stringify(logprobsJson);
    for (const event of parsed) {
      if (event.kind === 'reasoning') {
        if (current?.kind !== 'reasoning') startItem({ kind: 'reasoning', id: newId('rs'), outputIndex: 0, text: '' });
        const item = current as unknown as Extract<OpenItem, { kind: 'reasoning' }>;
        item.text += event.text;
        reasoningText += event.text;
        events?.event('response.reasoning_text.delta', { item_id: item.id, output_index: item.outputIndex, content_index: 0, delta: event.text });
      } else if (event.kind === 'content') {
        if (current?.kind !== 'message') startItem({ kind: 'message', id: newItemId(), outputIndex: 0, text: '' });
        (current as unknown as Extract<OpenItem, { kind: 'message' }>).text += event.text;
        messageText += event.text;
        events?.delta(event.text, logprobsOfText);
        logprobsOfText = '[]';
      } else if (event.kind === 'call') {
        startItem({ kind: 'call', id: newId('fc'), outputIndex: 0, callId: event.id, name: event.name, arguments: '' });
      } else if (current?.kind === 'call') {
        current.arguments += event.text;
        events?.event('response.function_call_arguments.delta', { item_id: current.id, output_index: current.outputIndex, delta: event.text });
      }
    }
  };
  /** An answer, even an empty one, keeps the turns alternating; a failure before any text added nothing. */
  const conversationAfter = (isFailed: boolean) =>
    isWarmUp || (isFailed && messageText === '' && calls.length === 0) ? prepared.messages : [...prepared.messages, assistantMessage(messageText, calls)];
  /** What the store keeps: the response without its log-probabilities' JSON, and them as typed arrays. */
  const storedOf = (response: ReturnType<typeof responseObject>, isFailed: boolean): StoredResponse => ({
    response, messages: conversationAfter(isFailed), logprobs: logprobs === null ? null : logprobs.build(),
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
    const json = takeLogprobs(entries);
    open();
    apply(parser.push(delta), json);
    if (events === null) return;
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
    open();
    if (!isWarmUp) {
      apply(parser.finish(), null);
      // Every answer has a message, even an empty one, unless it made calls.
      if (done.length === 0 && current === null && parser.toolCalls.length === 0) {
        startItem({ kind: 'message', id: newItemId(), outputIndex: 0, text: '' });
      }
      if (events !== null) closingEvents = [];
      closeItem(status === 'incomplete' ? 'incomplete' : 'completed');
      calls.push(...parser.toolCalls);
    }
    const numReasoningTokens = reasoningText === '' ? 0 : model.tokenizer.encode(reasoningText, { addSpecialTokens: false }).length;
    const usage = responseUsageOf(finish.usage, isWarmUp ? 0 : finish.usage.completion_tokens, numReasoningTokens);
    const stored = storedOf(responseObject(echo, { status, output: done, usage }), false);
    if (events === null) {
      end({ kind: 'done', stored });
      return;
    }
    const closing = closingEvents ?? [];
    closingEvents = null;
    closing.push([status === 'incomplete' ? 'response.incomplete' : 'response.completed', { response: responseObjectOf(stored) }]);
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
    closeItem('incomplete', false);
    const stored = storedOf(responseObject(echo, { status: 'failed', output: done, usage: null, error }), true);
    events.event('response.failed', { response: responseObjectOf(stored) });
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
