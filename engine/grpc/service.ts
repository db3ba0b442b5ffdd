// The worker's gRPC face: a thin adapter from proto/engine.proto to the Engine. Each Stream
// call gets its own request-id namespace; its requests' outputs are gathered through a step and
// sent in one message with the step's report (KV events, load, statistics), so the wire carries
// one message per step, not one per request per token. When the call goes away every request it
// started is aborted, so a vanished gateway never leaves blocks behind. A stream with nothing to
// carry for a second gets a heartbeat (the load, no outputs), so that a silent stream means a
// hung worker, which the gateway's supervisor kills and restarts. A request that ends aborted
// or failed leaves one log line with the gateway's id of it; tokens are never logged.
import * as grpc from '@grpc/grpc-js';
import type { Engine } from '../engine.ts';
import { silentLogger, type Logger } from '../log.ts';
import type { EngineError } from '../errors.ts';
import type { GenerateRequest, RequestOutput } from '../types.ts';
import { errorOutput } from '../request-output.ts';
import {
  generateFromWire,
  healthToWire,
  loadEngineService,
  maxClientMessageBytes,
  WireFormatError,
  outputToWire,
  stepToWire,
  type ClientMessage__Output,
  type HealthResponse,
  type StepOutput,
  type WireRequestOutput,
} from './wire.ts';

export interface EngineServer {
  /** 'HOST:PORT' with the bound port, or 'unix:PATH'. */
  readonly address: string;
  /** Ends every open stream (aborting its requests) and stops listening. */
  close(): Promise<void>;
}

type StreamCall = grpc.ServerDuplexStream<ClientMessage__Output, StepOutput>;

/** An idle stream carries a heartbeat this often (a step report, when steps run, is one too). */
export const HEARTBEAT_INTERVAL_MS = 1_000;

/** One line for a request that did not finish normally: an abort at info, a failure at warn. */
function logEnding(log: Logger, output: RequestOutput, externalRequestId: string | undefined, engineRequestId: string) {
  const fields = {
    request_id: externalRequestId,
    engine_request_id: engineRequestId,
    num_prompt_tokens: output.numPromptTokens,
    num_output_tokens: output.numOutputTokens,
  };
  if (output.finishReason === 'abort') log.info(fields, 'request aborted');
  else if (output.finishReason === 'error') log.warn({ ...fields, code: output.error?.code, detail: output.error?.message }, 'request failed');
}

function serveStream(engine: Engine, call: StreamCall, streamKey: string, log: Logger, onClosed: () => void): () => void {
  /** Wire request ids still in flight on this stream, with the gateway's id of each (for the log). */
  const inFlight = new Map<string, string | undefined>();
  /** This stream's outputs since the last report. */
  let pending: WireRequestOutput[] = [];
  let open = true;
  let hasWrittenSinceHeartbeat = false;

  const unsubscribe = engine.onReport((report) => {
    if (!open) return;
    call.write(stepToWire(pending, report));
    pending = [];
    hasWrittenSinceHeartbeat = true;
  });
  const heartbeatTimer = setInterval(() => {
    // Outputs waiting for their step's report go with it, never ahead of it.
    if (!hasWrittenSinceHeartbeat && pending.length === 0) call.write(stepToWire([], { events: [], load: engine.health().load, stats: null }));
    hasWrittenSinceHeartbeat = false;
  }, HEARTBEAT_INTERVAL_MS);

  const close = () => {
    if (!open) return;
    open = false;
    clearInterval(heartbeatTimer);
    unsubscribe();
    for (const [requestId, externalRequestId] of inFlight) {
      engine.abort(streamKey + requestId);
      log.info({ request_id: externalRequestId, engine_request_id: streamKey + requestId }, 'request aborted: its stream closed');
    }
    inFlight.clear();
    onClosed();
  };

  call.on('data', (message: ClientMessage__Output) => {
    if (message.abort) {
      if (inFlight.has(message.abort.requestId)) engine.abort(streamKey + message.abort.requestId);
      return;
    }
    if (!message.generate) return;
    const refuse = (requestId: string, numPromptTokens: number, refusal: EngineError) => {
      const output = outputToWire(errorOutput(requestId, numPromptTokens, refusal), requestId);
      call.write(stepToWire([output], { events: [], load: engine.health().load, stats: null }));
    };
    let request: GenerateRequest;
    try {
      request = generateFromWire(message.generate);
    } catch (err) {
      if (!(err instanceof WireFormatError)) throw err;
      refuse(message.generate.requestId, 0, { code: 'invalid_request', message: err.message });
      return;
    }
    const { requestId } = request;
    if (inFlight.has(requestId)) {
      refuse(requestId, request.promptTokenIds.length, { code: 'invalid_request', message: `Request ${requestId} is already in flight on this stream` });
      return;
    }
    const { externalRequestId } = request;
    inFlight.set(requestId, externalRequestId);
    engine.generate({ ...request, requestId: streamKey + requestId }, (output) => {
      if (!open) return;
      if (output.finishReason !== null) {
        inFlight.delete(requestId);
        logEnding(log, output, externalRequestId, output.requestId);
      }
      pending.push(outputToWire(output, requestId));
    });
  });
  call.on('end', () => {
    close();
    call.end();
  });
  call.on('cancelled', close);
  call.on('error', close);
  return () => {
    close();
    call.end();
  };
}

/** Serves the engine on listen ('HOST:PORT', port 0 for any free port, or 'unix:PATH'). */
export async function serveEngine(engine: Engine, listen: string, log: Logger = silentLogger): Promise<EngineServer> {
  const server = new grpc.Server({ 'grpc.max_receive_message_length': maxClientMessageBytes(engine.model.maxModelLen) });
  const openStreams = new Set<() => void>();
  let numStreams = 0;
  server.addService(loadEngineService().service, {
    Stream(call: StreamCall) {
      const endStream = serveStream(engine, call, `${numStreams++}/`, log, () => openStreams.delete(endStream));
      openStreams.add(endStream);
    },
    Health(_call: grpc.ServerUnaryCall<unknown, HealthResponse>, callback: grpc.sendUnaryData<HealthResponse>) {
      callback(null, healthToWire(engine.health()));
    },
  });
  const port = await new Promise<number>((resolve, reject) => {
    server.bindAsync(listen, grpc.ServerCredentials.createInsecure(), (err, boundPort) =>
      err ? reject(new Error(`cannot listen on ${listen}: ${err.message}`)) : resolve(boundPort),
    );
  });
  const address = listen.startsWith('unix:') ? listen : `${listen.slice(0, listen.lastIndexOf(':'))}:${port}`;
  return {
    address,
    close: () =>
      new Promise<void>((resolve) => {
        for (const endStream of openStreams) endStream();
        server.tryShutdown(() => resolve());
      }),
  };
}
