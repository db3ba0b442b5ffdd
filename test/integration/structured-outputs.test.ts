// Structured outputs and tools on the real server (conduit-tiny, grammar threads in its worker),
// through the official clients: random JSON schemas at temperature 1 all validate and stream
// what they answer whole; the SDK's parse helpers with zod; forced calls parse; and an agents-SDK
// agent runs a whole tool loop.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Ajv2020 } from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import OpenAI from 'openai';
import { zodFunction, zodResponseFormat, zodTextFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import type { RunningServer } from '../../bin/serve.ts';
import { testSeed } from '../seed.ts';
import { defaultModelDir, openaiClient, startServer } from './harness.ts';
import { SchemaSampler } from './random-schema.ts';

const modelName = 'conduit-tiny';
let server: RunningServer;
let client: OpenAI;

before(async () => {
  server = await startServer([{ path: defaultModelDir, num_workers: 1, threads_per_worker: 1, kv_cache_blocks: 512, max_num_seqs: 16 }]);
  client = openaiClient(`${server.httpAddress}/v1`);
});

after(async () => {
  await server?.close();
});

const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats.default(ajv);

/** A chat answer's text and finish reason, streamed or not. */
async function complete(body: OpenAI.Chat.ChatCompletionCreateParamsNonStreaming, stream: boolean) {
  if (!stream) {
    const response = await client.chat.completions.create(body);
    return { text: response.choices[0].message.content ?? '', finishReason: response.choices[0].finish_reason };
  }
  let text = '';
  let finishReason: string | null = null;
  for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
    text += chunk.choices[0]?.delta.content ?? '';
    finishReason = chunk.choices[0]?.finish_reason ?? finishReason;
  }
  return { text, finishReason };
}

test('random JSON schemas at temperature 1: every output validates with ajv, and streams what it answers whole', { timeout: 300_000 }, async (t) => {
  const seed = testSeed(t);
  const sampler = new SchemaSampler(seed);
  const schemas = Array.from({ length: 10 }, (_, i) => ({ schema: sampler.object(0, i % 2 === 0), strict: i % 2 === 0 }));
  await Promise.all(
    schemas.map(async ({ schema, strict }, i) => {
      const body: OpenAI.Chat.ChatCompletionCreateParamsNonStreaming = {
        model: modelName,
        messages: [{ role: 'user', content: `Fill in record ${i}.` }],
        temperature: 1,
        seed: seed + i,
        max_tokens: 900,
        response_format: { type: 'json_schema', json_schema: { name: `record_${i}`, schema, strict } },
      };
      const label = `seed ${seed}, schema ${i}: ${JSON.stringify(schema)}`;
      const whole = await complete(body, false);
      assert.equal(whole.finishReason, 'stop', `${label}\n${whole.text}`);
      const validate = ajv.compile(schema);
      assert.ok(validate(JSON.parse(whole.text)), `${label}\n${whole.text}\n${ajv.errorsText(validate.errors)}`);
      const streamed = await complete(body, true);
      assert.equal(streamed.text, whole.text, label);
      assert.equal(streamed.finishReason, 'stop', label);
    }),
  );
});

test('the SDK\'s parse helpers with zod: chat.completions.parse and responses.parse return parsed objects', { timeout: 120_000 }, async () => {
  const Forecast = z.object({ city: z.string().max(10), celsius: z.number().int().min(-40).max(50), sky: z.enum(['clear', 'cloudy', 'rain']) });
  const chat = await client.chat.completions.parse({
    model: modelName, messages: [{ role: 'user', content: 'Forecast?' }], temperature: 1, seed: 7, max_tokens: 200,
    response_format: zodResponseFormat(Forecast, 'forecast'),
  });
  const parsed = chat.choices[0].message.parsed;
  assert.ok(parsed !== null && Forecast.safeParse(parsed).success, JSON.stringify(chat.choices[0].message));
  const response = await client.responses.parse({
    model: modelName, input: 'Forecast?', temperature: 1, max_output_tokens: 200, text: { format: zodTextFormat(Forecast, 'forecast') },
  });
  assert.ok(response.output_parsed !== null && Forecast.safeParse(response.output_parsed).success, response.output_text);
});

test('forced calls on a model never taught tools: required and named parse with the SDK, streamed as whole', { timeout: 120_000 }, async () => {
  const weather = zodFunction({ name: 'get_weather', parameters: z.object({ city: z.string().max(12), unit: z.enum(['c', 'f']) }) });
  const time = zodFunction({ name: 'get_time', parameters: z.object({ zone: z.enum(['utc', 'cet']) }) });
  for (const [toolChoice, finishReason] of [['required', 'tool_calls'], [{ type: 'function', function: { name: 'get_time' } }, 'stop']] as const) {
    const body = {
      model: modelName, messages: [{ role: 'user' as const, content: 'Weather?' }], temperature: 1, seed: 11, max_tokens: 200,
      tools: [weather, time], tool_choice: toolChoice, parallel_tool_calls: false,
    };
    const response = await client.chat.completions.parse(body);
    const [choice] = response.choices;
    assert.equal(choice.finish_reason, finishReason, JSON.stringify(choice.message));
    assert.equal(choice.message.tool_calls?.length, 1, JSON.stringify(choice.message));
    const call = choice.message.tool_calls![0] as OpenAI.Chat.ChatCompletionMessageFunctionToolCall & { function: { parsed_arguments: unknown } };
    if (typeof toolChoice === 'object') assert.equal(call.function.name, 'get_time');
    const schema = call.function.name === 'get_weather' ? z.object({ city: z.string().max(12), unit: z.enum(['c', 'f']) }) : z.object({ zone: z.enum(['utc', 'cet']) });
    assert.ok(schema.safeParse(call.function.parsed_arguments).success, call.function.arguments);

    let streamedArguments = '';
    let streamedName = '';
    for await (const chunk of await client.chat.completions.create({ ...body, tools: body.tools, stream: true } as OpenAI.Chat.ChatCompletionCreateParamsStreaming)) {
      for (const delta of chunk.choices[0]?.delta.tool_calls ?? []) {
        streamedName += delta.function?.name ?? '';
        streamedArguments += delta.function?.arguments ?? '';
      }
    }
    assert.equal(streamedName, call.function.name);
    assert.equal(streamedArguments, call.function.arguments);
  }
});

test('an @openai/agents agent with a function tool runs a whole loop: its call, our output, its answer', { timeout: 120_000 }, async () => {
  const { Agent, run, setDefaultOpenAIClient, setOpenAIAPI, setTracingDisabled, tool } = await import('@openai/agents');
  setTracingDisabled(true);
  setDefaultOpenAIClient(client);
  setOpenAIAPI('responses');
  const cities: string[] = [];
  const getWeather = tool({
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: z.object({ city: z.string().max(12) }),
    execute: async ({ city }) => {
      cities.push(city);
      return `Sunny and 21 C in ${city}.`;
    },
  });
  const agent = new Agent({
    name: 'Forecaster',
    instructions: 'Answer with the weather tool.',
    model: modelName,
    tools: [getWeather],
    // The first turn must call, once; the SDK then resets tool_choice to auto, and the second
    // answers in text. A seed (the Responses API's extension, through providerData) pins the
    // sampled text: the model, not the protocol, decides whether auto calls again.
    modelSettings: { toolChoice: 'required', parallelToolCalls: false, maxTokens: 160, temperature: 1, providerData: { seed: 1 } },
  });
  const result = await run(agent, 'What is the weather in Oslo?', { maxTurns: 4 });
  assert.equal(cities.length, 1, 'the tool ran once');
  assert.equal(result.rawResponses.length, 2, 'a call, then the answer');
  assert.deepEqual(
    result.newItems.map((item) => item.type),
    ['tool_call_item', 'tool_call_output_item', 'message_output_item'],
  );
  assert.equal(typeof result.finalOutput, 'string');
});
