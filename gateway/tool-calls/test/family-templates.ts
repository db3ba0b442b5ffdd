// Chat templates in each family's tool format, written for the tests the way those checkpoints'
// own templates lay tools out (the gateway reads a family from its template): Hermes / Qwen2.5's
// <tools> system block and <tool_call> tags, with results as <tool_response>; Llama 3.1's JSON
// calls with "parameters" and ipython results; Mistral's [AVAILABLE_TOOLS] and [TOOL_CALLS]
// array; and Qwen3's, Hermes with a <think> section.

export const HERMES_TEMPLATE = `{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are a helpful assistant.{% endif %}{{ '\n\n' }}# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>{% for tool in tools %}{{ '\n' }}{{ tool | tojson }}{% endfor %}{{ '\n' }}</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' %}<|im_start|>assistant
{{ message.content }}{% if message.tool_calls %}{% for call in message.tool_calls %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>{% endfor %}{% endif %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.role != 'system' %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}`;

export const QWEN3_TEMPLATE = HERMES_TEMPLATE.replace(
  '{{ message.content }}{% if message.tool_calls %}',
  '{% if message.reasoning_content %}<think>\n{{ message.reasoning_content }}\n</think>\n\n{% endif %}{{ message.content }}{% if message.tool_calls %}',
);

export const LLAMA3_TEMPLATE = `{{ bos_token }}<|start_header_id|>system<|end_header_id|>

Environment: ipython<|eot_id|>
{%- for message in messages %}
{%- if message.role == 'user' and loop.last and tools %}<|start_header_id|>user<|end_header_id|>

Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.

Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}. Do not use variables.
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
{{ message.content }}<|eot_id|>
{%- elif message.role == 'assistant' and message.tool_calls %}<|start_header_id|>assistant<|end_header_id|>

{% for call in message.tool_calls %}{"name": "{{ call.function.name }}", "parameters": {{ call.function.arguments | tojson }}}{% endfor %}<|eot_id|>
{%- elif message.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- else %}<|start_header_id|>{{ message.role }}<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}`;

export const MISTRAL_TEMPLATE = `{{ bos_token }}{% for message in messages %}{% if message.role == 'user' %}{% if loop.last and tools %}[AVAILABLE_TOOLS][{% for tool in tools %}{{ tool | tojson }}{% if not loop.last %}, {% endif %}{% endfor %}][/AVAILABLE_TOOLS]{% endif %}[INST] {{ message.content }}[/INST]{% elif message.role == 'assistant' %}{% if message.tool_calls %}[TOOL_CALLS][{% for call in message.tool_calls %}{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}, "id": "{{ call.id }}"}{% if not loop.last %}, {% endif %}{% endfor %}]{% else %}{{ message.content }}{% endif %}{{ eos_token }}{% elif message.role == 'tool' %}[TOOL_RESULTS]{"call_id": "{{ message.tool_call_id }}", "content": {{ message.content | tojson }}}[/TOOL_RESULTS]{% endif %}{% endfor %}`;
