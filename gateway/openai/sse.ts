// Server-Sent Events in OpenAI's framing. A response's chunks differ only in their one choice,
// so the envelope (id, object, created, model) is serialized once and each chunk serializes
// just its choice: the per-token path stringifies a short text, not a whole object tree.

export const SSE_DONE = 'data: [DONE]\n\n';

/** An SSE comment: clients skip it, while proxies and idle timers see bytes flow. */
export const SSE_KEEP_ALIVE = ': keep-alive\n\n';

export function sseEvent(data: object): string {
  return `data: ${JSON.stringify(data)}\n\n`;
}

/**
 * Returns a function that wraps one choice's JSON into
 * `data: {...envelope, "choices":[choice]}\n\n`, with `"usage":{...}` after the choices when given
 * (vLLM's continuous usage).
 */
export function sseChoiceFramer(envelope: object): (choiceJson: string, usage?: object | null) => string {
  const placeholder = '\u0000choice';
  const [head, tail] = JSON.stringify({ ...envelope, choices: [placeholder] }).split(JSON.stringify(placeholder));
  const prefix = `data: ${head}`;
  const suffix = `${tail}\n\n`;
  // tail is `]}`: the usage goes between the two.
  const usagePrefix = `${tail.slice(0, -1)},"usage":`;
  return (choiceJson, usage) =>
    usage == null ? prefix + choiceJson + suffix : `${prefix}${choiceJson}${usagePrefix}${JSON.stringify(usage)}}\n\n`;
}

/** Response headers of every event stream. */
export const SSE_HEADERS = {
  'content-type': 'text/event-stream; charset=utf-8',
  'cache-control': 'no-cache',
  connection: 'keep-alive',
  // Proxies such as nginx would otherwise buffer the stream.
  'x-accel-buffering': 'no',
} as const;

/** A named event (`event: <type>`), as the Responses API streams them; json is the serialized data. */
export function sseNamedEvent(type: string, json: string): string {
  return `event: ${type}\ndata: ${json}\n\n`;
}
