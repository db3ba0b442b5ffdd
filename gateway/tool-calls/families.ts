// How a model family writes tool calls and thinks out loud, told from its chat template (the
// checkpoint's own, which is what taught it the format):
//   - hermes (Qwen2, Qwen2.5, Qwen3, Hermes, and the default): <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
//   - llama3_json (Llama 3.1 to 3.3): {"name": ..., "parameters": {...}}, bare, several joined by "; "
//   - mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
// A template that mentions <think> belongs to a reasoning model (Qwen3, DeepSeek-R1): its output
// opens with a <think>...</think> section, unless the prompt already opened or closed one.

export type ToolCallFamily = 'hermes' | 'llama3_json' | 'mistral';

export interface ReasoningTags {
  start: string;
  end: string;
}

export interface ModelFormats {
  toolCalls: ToolCallFamily;
  /** The chat template renders `tools` itself; otherwise the gateway describes them in a system message. */
  templateRendersTools: boolean;
  /** The chat template renders past calls (`tool_calls`) itself; otherwise the gateway writes them as text. */
  templateRendersToolCalls: boolean;
  reasoning: ReasoningTags | null;
}

/** What each family writes around one call, and between calls. */
export interface CallSyntax {
  /** A marker that opens calls anywhere in the text (hermes' per call, mistral's once), or null. */
  marker: string | null;
  /** Calls may also open the answer bare, without the marker (its first non-space character is this). */
  bareOpening: '{' | '[' | null;
  /** Written after each call's object (hermes' end tag). */
  closing: string | null;
  /** Between two calls (llama3's "; ", mistral's ", "); null: each call has its own marker. */
  separator: string | null;
  /** The calls sit in a JSON array (mistral). */
  isArray: boolean;
  /** The key of the arguments object. */
  argumentsKey: 'arguments' | 'parameters';
}

export const CALL_SYNTAX: Record<ToolCallFamily, CallSyntax> = {
  hermes: { marker: '<tool_call>', bareOpening: null, closing: '</tool_call>', separator: null, isArray: false, argumentsKey: 'arguments' },
  llama3_json: { marker: '<|python_tag|>', bareOpening: '{', closing: null, separator: ';', isArray: false, argumentsKey: 'parameters' },
  mistral: { marker: '[TOOL_CALLS]', bareOpening: '[', closing: null, separator: ',', isArray: true, argumentsKey: 'arguments' },
};

export const THINK_TAGS: ReasoningTags = { start: '<think>', end: '</think>' };

export function formatsOf(chatTemplate: string | null): ModelFormats {
  const template = chatTemplate ?? '';
  const toolCalls: ToolCallFamily = template.includes('[TOOL_CALLS]')
    ? 'mistral'
    : template.includes('<|python_tag|>') || template.includes('ipython')
      ? 'llama3_json'
      : 'hermes';
  return {
    toolCalls,
    templateRendersTools: /\btools\b/.test(template),
    templateRendersToolCalls: /\btool_calls\b/.test(template),
    reasoning: template.includes(THINK_TAGS.start) ? THINK_TAGS : null,
  };
}

/**
 * Where a prompt leaves a reasoning model: inside a think section its template opened
 * (DeepSeek-R1), after one it closed empty (Qwen3 with thinking off), or before any (Qwen3, which
 * opens its own).
 */
export function reasoningStateOf(prompt: string, tags: ReasoningTags): 'open' | 'closed' | 'none' {
  const tail = prompt.trimEnd();
  if (tail.endsWith(tags.start)) return 'open';
  if (tail.endsWith(tags.end)) return 'closed';
  return 'none';
}
