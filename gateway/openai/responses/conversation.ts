// The conversation a response continues, as chat-template messages: input items (messages,
// function calls and their outputs) appended to what the previous response left. Reasoning items a
// client sends back are dropped: templates do not show a model its past thinking. Messages are
// plain data never modified once made, so a stored conversation is shared, not copied, by every
// response that continues it.
import { ApiError } from '../../errors.ts';
import type { ChatMessage, ChatToolCall } from '../../tokenizer/chat-template.ts';
import { argumentsValueOf } from '../../tool-calls/tools.ts';
import type { ContentPart, InputItem } from './schema.ts';

function textOf(parts: readonly ContentPart[], param: string): string {
  let text = '';
  for (const [index, part] of parts.entries()) {
    if (part.type === 'refusal') text += part.refusal;
    else if (part.type === 'input_text' || part.type === 'output_text') text += part.text;
    else throw new ApiError('unsupported_parameter', `Content of type '${part.type}' is not supported: the model reads text only.`, `${param}[${index}]`);
  }
  return text;
}

function findCall(messages: readonly ChatMessage[], callId: string): ChatToolCall | undefined {
  for (let i = messages.length - 1; i >= 0; i--) {
    const call = messages[i].tool_calls?.find((candidate) => candidate.id === callId);
    if (call !== undefined) return call;
  }
  return undefined;
}

/** history followed by this turn's input items; history itself is left as it is. */
export function appendInput(history: readonly ChatMessage[], items: readonly InputItem[]): ChatMessage[] {
  const messages = history.slice();
  for (const [index, item] of items.entries()) {
    const param = `input[${index}]`;
    if (item.type === 'message') {
      // "developer" is OpenAI's newer name for "system", which is what chat templates know.
      messages.push({ role: item.role === 'developer' ? 'system' : item.role, content: textOf(item.content, `${param}.content`) });
    } else if (item.type === 'function_call') {
      const call: ChatToolCall = { id: item.call_id, type: 'function', function: { name: item.name, arguments: argumentsValueOf(item.arguments) } };
      const last = messages.at(-1);
      // Parallel calls, and the text an assistant wrote before calling, are one assistant turn.
      if (last?.role === 'assistant') messages[messages.length - 1] = { ...last, tool_calls: [...(last.tool_calls ?? []), call] };
      else messages.push({ role: 'assistant', content: '', tool_calls: [call] });
    } else if (item.type === 'function_call_output') {
      const call = findCall(messages, item.call_id);
      if (call === undefined) {
        throw new ApiError('invalid_request', `No function call found for function_call_output with call_id '${item.call_id}'.`, `${param}.call_id`);
      }
      messages.push({ role: 'tool', content: textOf(item.output, `${param}.output`), tool_call_id: item.call_id, name: call.function.name });
    }
  }
  return messages;
}

/** An assistant turn: its text and the calls it made (a later turn's function_call_output answers them by call id). */
export function assistantMessage(text: string, calls: ReadonlyArray<{ id: string; name: string; arguments: string }> = []): ChatMessage {
  if (calls.length === 0) return { role: 'assistant', content: text };
  const toolCalls = calls.map((call): ChatToolCall => ({ id: call.id, type: 'function', function: { name: call.name, arguments: argumentsValueOf(call.arguments) } }));
  return { role: 'assistant', content: text, tool_calls: toolCalls };
}

/** What the template renders: instructions are this turn's only (OpenAI does not carry them over a chain). */
export function promptMessages(instructions: string | null | undefined, conversation: readonly ChatMessage[]): readonly ChatMessage[] {
  if (instructions === null || instructions === undefined || instructions === '') return conversation;
  return [{ role: 'system', content: instructions }, ...conversation];
}
