// A request's function tools, as chat and the Responses API both give them: what the prompt says
// about them, and the grammar that makes `required` and a named tool_choice produce well-formed
// calls in the family's own format (a structural tag: the family's wrapper around each function's
// parameters schema). A call in the model's native format keeps it in distribution; a foreign
// wrapper is what sends models off into strings that never close (llguidance, toolcalls.md).
import type { StructuredConstraint } from '../../engine/types.ts';
import { ApiError } from '../errors.ts';
import { checkJsonSchema } from '../openai/structured-outputs.ts';
import type { ChatMessage } from '../tokenizer/chat-template.ts';
import type { ModelFormats, ToolCallFamily } from './families.ts';

export interface ToolDefinition {
  name: string;
  description: string | null;
  /** A JSON schema of the arguments object; null for none given (any object). */
  parameters: Record<string, unknown> | null;
  strict: boolean;
}

/** none: the model is told of no tools; auto: it may call; required: it must; named: it must call that one. */
export type ToolChoice = 'none' | 'auto' | 'required' | { name: string };

/** How the request's tools shape one generation. */
export interface ToolPlan {
  tools: readonly ToolDefinition[];
  choice: ToolChoice;
  parallel: boolean;
}

/** transformers hands templates a call's arguments as an object (they write it with tojson); text that is not a JSON object stays text. */
export function argumentsValueOf(text: string): unknown {
  try {
    const parsed: unknown = JSON.parse(text);
    if (parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed)) return parsed;
  } catch {
    // Not JSON: the template gets the text as written.
  }
  return text;
}

/** Checks each tool's parameters as a JSON schema (strict ones under OpenAI's rules); param(i) names the tool's schema field. */
export function checkTools(tools: readonly ToolDefinition[], param: (index: number) => string): void {
  const seen = new Set<string>();
  tools.forEach((tool, index) => {
    if (seen.has(tool.name)) throw new ApiError('invalid_request', `Tool names must be unique; '${tool.name}' appears twice.`, param(index));
    seen.add(tool.name);
    if (tool.parameters !== null) checkJsonSchema(tool.parameters, tool.strict, `function '${tool.name}'`, param(index));
  });
}

/** The choice checked against the tools: a named function must be one of them, and any choice but none needs some. */
export function checkToolChoice(choice: ToolChoice, tools: readonly ToolDefinition[], param: string): void {
  if (typeof choice === 'object' && !tools.some((tool) => tool.name === choice.name)) {
    throw new ApiError('invalid_request', `tool_choice names the function '${choice.name}', which is not among the tools.`, param);
  }
  if (choice === 'required' && tools.length === 0) {
    throw new ApiError('invalid_request', "tool_choice 'required' needs at least one tool.", param);
  }
}

function toolJson(tool: ToolDefinition): object {
  return {
    type: 'function',
    function: {
      name: tool.name,
      ...(tool.description === null ? {} : { description: tool.description }),
      parameters: tool.parameters ?? { type: 'object', properties: {} },
    },
  };
}

/** The tools as chat templates take them (transformers' `tools`: OpenAI's function tool objects). */
function templateTools(tools: readonly ToolDefinition[]): object[] {
  return tools.map(toolJson);
}

/** Hermes' system prompt for a template that does not render tools itself (Qwen2.5's wording). */
function hermesToolPrompt(tools: readonly ToolDefinition[]): string {
  return [
    '# Tools',
    '',
    'You may call one or more functions to assist with the user query.',
    '',
    'You are provided with function signatures within <tools></tools> XML tags:',
    '<tools>',
    ...tools.map((tool) => JSON.stringify(toolJson(tool))),
    '</tools>',
    '',
    'For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:',
    '<tool_call>',
    '{"name": <function-name>, "arguments": <args-json-object>}',
    '</tool_call>',
  ].join('\n');
}

/** A call as Hermes writes it, for history the template cannot render. */
function hermesCallText(name: string, args: unknown): string {
  return `<tool_call>\n${JSON.stringify({ name, arguments: args })}\n</tool_call>`;
}

/**
 * The messages and template variables that tell the model of its tools. A template that renders
 * `tools` gets them as a variable, and one that renders `tool_calls` gets past calls and results
 * as messages. For one that does not, the tools are described in the system message in Hermes'
 * words, past calls become <tool_call> text and results <tool_response> text, so the model sees
 * one consistent format.
 */
export function promptWithTools(
  formats: ModelFormats,
  messages: readonly ChatMessage[],
  tools: readonly ToolDefinition[],
): { messages: readonly ChatMessage[]; tools: object[] | undefined } {
  if (formats.templateRendersTools) return { messages, tools: tools.length === 0 ? undefined : templateTools(tools) };
  const hasHistory = !formats.templateRendersToolCalls && messages.some((message) => message.tool_calls !== undefined || message.role === 'tool');
  if (tools.length === 0 && !hasHistory) return { messages, tools: undefined };
  const rewritten = !hasHistory ? messages : messages.map((message): ChatMessage => {
    if (message.role === 'tool') return { role: 'tool', content: `<tool_response>\n${message.content}\n</tool_response>` };
    if (message.tool_calls === undefined) return message;
    const calls = message.tool_calls.map((call) => hermesCallText(call.function.name, call.function.arguments));
    return { role: message.role, content: [message.content, ...calls].filter((part) => part !== '').join('\n') };
  });
  if (tools.length === 0) return { messages: rewritten, tools: undefined };
  const toolPrompt = hermesToolPrompt(tools);
  const first = rewritten[0];
  if (first?.role === 'system') return { messages: [{ ...first, content: `${first.content}\n\n${toolPrompt}` }, ...rewritten.slice(1)], tools: undefined };
  return { messages: [{ role: 'system', content: toolPrompt }, ...rewritten], tools: undefined };
}

/** One function's call in the family's format, its arguments held to its parameters schema. */
function callTag(family: ToolCallFamily, tool: ToolDefinition): object {
  const schema = tool.parameters ?? { type: 'object' };
  const name = JSON.stringify(tool.name);
  const content = { type: 'json_schema', json_schema: schema };
  switch (family) {
    case 'hermes':
      return { type: 'tag', begin: `<tool_call>\n{"name": ${name}, "arguments": `, content, end: '}\n</tool_call>' };
    case 'llama3_json':
      return { type: 'tag', begin: `{"name": ${name}, "parameters": `, content, end: '}' };
    case 'mistral':
      return { type: 'tag', begin: `{"name": ${name}, "arguments": `, content, end: '}' };
  }
}

export const MISTRAL_MARKER = '[TOOL_CALLS]';
const SEPARATOR: Record<ToolCallFamily, string> = { hermes: '\n', llama3_json: '; ', mistral: ', ' };
/** What a call of each family begins with, as a structural tag's trigger. */
const TRIGGER: Record<ToolCallFamily, string> = { hermes: '<tool_call>', llama3_json: '{"name": ', mistral: '{"name": ' };

/**
 * The grammar of the output when calls are forced (spellMarker: Mistral's begin with the text of
 * its marker, which is not a special token of this tokenizer): required (one or more, or exactly one without
 * parallel calls), or a named function (exactly one call of it). auto is constrained only when
 * a tool is strict (vLLM's rule): text stays free, and a call, once begun, must be well formed.
 * Null when nothing constrains the output.
 */
export function toolCallConstraint(family: ToolCallFamily, plan: ToolPlan, spellMarker = false): StructuredConstraint | null {
  const { tools, choice, parallel } = plan;
  if (choice === 'none' || tools.length === 0) return null;
  let format: object;
  if (choice === 'auto') {
    // Mistral's calls sit inside one array, which triggers cannot express: its auto stays free.
    if (!tools.some((tool) => tool.strict) || family === 'mistral') return null;
    format = { type: 'triggered_tags', triggers: [TRIGGER[family]], tags: tools.map((tool) => callTag(family, tool)), at_least_one: false, stop_after_first: !parallel };
  } else {
    const chosen = typeof choice === 'object' ? tools.filter((tool) => tool.name === choice.name) : tools;
    const calls = { type: 'tags_with_separator', tags: chosen.map((tool) => callTag(family, tool)), separator: SEPARATOR[family], at_least_one: true, stop_after_first: typeof choice === 'object' || !parallel };
    // Mistral's marker: spelled by the grammar where the tokenizer has it as text; a special token
    // no grammar spells, which the worker outputs before the grammar (planOutput's prefixTokenIds).
    const opening = spellMarker ? `${MISTRAL_MARKER}[` : '[';
    format = family === 'mistral' ? { type: 'sequence', elements: [{ type: 'const_string', value: opening }, calls, { type: 'const_string', value: ']' }] } : calls;
  }
  return { kind: 'structural_tag', structuralTag: JSON.stringify({ type: 'structural_tag', format }) };
}
