// A model's configuration: Triton's ModelConfig fields that Conduit implements, read from
// config.pbtxt (protobuf text format) or config.yaml (the same fields), validated with zod.
// Every error names the file, the line and the field: `digits/config.pbtxt:7: input[0].data_type: ...`.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { LineCounter, parseDocument, isNode } from 'yaml';
import { z } from 'zod';
import { CONFIG_DATATYPES } from './datatype.ts';
import { parsePbtxt, PbtxtError } from './pbtxt.ts';

const int = z.number().int();
const dims = z.array(int.min(-1));

const inputSchema = z.object({
  name: z.string().min(1),
  data_type: z.enum(CONFIG_DATATYPES),
  dims,
  reshape: z.object({ shape: z.array(int.min(-1)).default([]) }).strict().optional(),
  allow_ragged_batch: z.boolean().default(false),
  optional: z.boolean().default(false),
}).strict();

const outputSchema = z.object({
  name: z.string().min(1),
  data_type: z.enum(CONFIG_DATATYPES),
  dims,
  reshape: z.object({ shape: z.array(int.min(-1)).default([]) }).strict().optional(),
  label_filename: z.string().optional(),
}).strict();

const queuePolicySchema = z.object({
  timeout_action: z.enum(['REJECT', 'DELAY']).default('REJECT'),
  default_timeout_microseconds: int.nonnegative().default(0),
  allow_timeout_override: z.boolean().default(false),
  max_queue_size: int.nonnegative().default(0),
}).strict();

const dynamicBatchingSchema = z.object({
  preferred_batch_size: z.array(int.positive()).default([]),
  max_queue_delay_microseconds: int.nonnegative().default(0),
  preserve_ordering: z.boolean().default(false),
  priority_levels: int.nonnegative().default(0),
  default_priority_level: int.nonnegative().default(0),
  default_queue_policy: queuePolicySchema.default(queuePolicySchema.parse({})),
  priority_queue_policy: z.record(z.string().regex(/^\d+$/, 'expected a priority level'), queuePolicySchema).default({}),
}).strict();

const versionPolicySchema = z.union([
  z.object({ latest: z.object({ num_versions: int.positive().default(1) }).strict() }).strict(),
  z.object({ all: z.object({}).strict() }).strict(),
  z.object({ specific: z.object({ versions: z.array(int.positive()).min(1) }).strict() }).strict(),
]);

const stepSchema = z.object({
  model_name: z.string().min(1),
  model_version: int.min(-1).default(-1),
  input_map: z.record(z.string(), z.string()).default({}),
  output_map: z.record(z.string(), z.string()).default({}),
}).strict();

const instanceGroupSchema = z.object({
  name: z.string().optional(),
  count: int.positive().default(1),
  kind: z.enum(['KIND_AUTO', 'KIND_CPU', 'KIND_GPU', 'KIND_MODEL']).default('KIND_AUTO'),
  gpus: z.array(int.nonnegative()).default([]),
}).strict();

const warmupInputSchema = z.object({
  data_type: z.enum(CONFIG_DATATYPES),
  dims: z.array(int.nonnegative()).default([]),
  zero_data: z.boolean().optional(),
  random_data: z.boolean().optional(),
  /** A file in `<model>/warmup/`. */
  input_data_file: z.string().regex(/^(?!\.\.?$)[^/\\]+$/, 'expected a file name in the model\'s warmup/ folder').optional(),
}).strict().refine((input) => [input.zero_data === true, input.random_data === true, input.input_data_file !== undefined].filter(Boolean).length === 1, {
  message: 'expected exactly one of zero_data: true, random_data: true, input_data_file',
});

const warmupSchema = z.object({
  name: z.string().min(1),
  batch_size: int.positive().default(1),
  inputs: z.record(z.string(), warmupInputSchema).default({}),
  /** Runs of this sample; 0 means once, as in Triton. */
  count: int.nonnegative().default(0),
}).strict();

const batchInputSchema = z.object({
  kind: z.enum([
    'BATCH_ELEMENT_COUNT', 'BATCH_ACCUMULATED_ELEMENT_COUNT', 'BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO',
    'BATCH_MAX_ELEMENT_COUNT_AS_SHAPE', 'BATCH_ITEM_SHAPE', 'BATCH_ITEM_SHAPE_FLATTEN',
  ]).default('BATCH_ELEMENT_COUNT'),
  target_name: z.array(z.string().min(1)).min(1),
  data_type: z.enum(['TYPE_INT32', 'TYPE_FP32']),
  source_input: z.array(z.string().min(1)).length(1, 'expected exactly one source_input'),
}).strict();

const CONTROL_KINDS = ['CONTROL_SEQUENCE_START', 'CONTROL_SEQUENCE_READY', 'CONTROL_SEQUENCE_END', 'CONTROL_SEQUENCE_CORRID'] as const;
export type ControlKind = (typeof CONTROL_KINDS)[number];
/** The datatypes Triton allows for a CORRID control tensor. */
const CORRID_DATATYPES = ['TYPE_UINT64', 'TYPE_INT64', 'TYPE_UINT32', 'TYPE_INT32', 'TYPE_STRING'];

const controlSchema = z.object({
  kind: z.enum(CONTROL_KINDS),
  int32_false_true: z.array(int).default([]),
  fp32_false_true: z.array(z.number()).default([]),
  bool_false_true: z.array(z.boolean()).default([]),
  data_type: z.enum(CONFIG_DATATYPES).optional(),
}).strict();

const initialStateSchema = z.object({
  name: z.string().min(1, 'must be set when using initial_state'),
  data_type: z.enum(CONFIG_DATATYPES),
  dims: z.array(int.nonnegative()).default([]),
  zero_data: z.boolean().optional(),
  /** A file in `<model>/initial_state/`. */
  data_file: z.string().regex(/^(?!\.\.?$)[^/\\]+$/, 'expected a file name in the model\'s initial_state/ folder').optional(),
}).strict().refine((state) => (state.zero_data === true) !== (state.data_file !== undefined), {
  message: 'expected exactly one of zero_data: true, data_file',
});

const sequenceBatchingSchema = z.object({
  // 0 takes Triton's default, 1 s (set when the config is normalized).
  max_sequence_idle_microseconds: int.nonnegative().default(0),
  control_input: z.array(z.object({ name: z.string().min(1), control: z.array(controlSchema).min(1) }).strict()).default([]),
  state: z.array(z.object({
    input_name: z.string().min(1),
    output_name: z.string().min(1),
    data_type: z.enum(CONFIG_DATATYPES),
    dims,
    initial_state: z.array(initialStateSchema).max(1, 'must contain exactly one or zero element').default([]),
    use_same_buffer_for_input_output: z.boolean().default(false),
    use_growable_memory: z.boolean().default(false),
  }).strict()).default([]),
  direct: z.object({
    max_queue_delay_microseconds: int.nonnegative().default(0),
    minimum_slot_utilization: z.number().min(0).max(1).default(0),
  }).strict().optional(),
  oldest: z.object({
    max_candidate_sequences: int.nonnegative().default(0),
    preferred_batch_size: z.array(int.positive()).default([]),
    max_queue_delay_microseconds: int.nonnegative().default(0),
    preserve_ordering: z.boolean().default(false),
  }).strict().optional(),
  iterative_sequence: z.boolean().default(false),
}).strict();

/** Triton fields Conduit accepts and ignores, so existing repositories load unchanged. */
const ignored = z.unknown().optional();

export const BACKENDS = ['onnxruntime', 'script', 'ensemble'] as const;
export type BackendName = (typeof BACKENDS)[number];
const PLATFORM_BACKENDS: Record<string, BackendName> = { onnxruntime_onnx: 'onnxruntime', ensemble: 'ensemble' };

const modelConfigSchemaBase = z.object({
  name: z.string().min(1).optional(),
  platform: z.string().optional(),
  backend: z.string().optional(),
  // Triton's field is an int32; a batch that large could never be formed anyway.
  max_batch_size: int.nonnegative().max(2 ** 31 - 1).default(0),
  input: z.array(inputSchema).default([]),
  output: z.array(outputSchema).default([]),
  instance_group: z.array(instanceGroupSchema).default([]),
  version_policy: versionPolicySchema.default({ latest: { num_versions: 1 } }),
  dynamic_batching: dynamicBatchingSchema.optional(),
  sequence_batching: sequenceBatchingSchema.optional(),
  ensemble_scheduling: z.object({ step: z.array(stepSchema).min(1) }).strict().optional(),
  // One name inside the version directory: a path could reach files outside the repository.
  default_model_filename: z.string().refine((name) => name !== '' && name !== '.' && name !== '..' && !/[/\\\0]/.test(name), {
    message: 'must be a file name inside the version directory: no path separators, no \'..\', no NUL',
  }).optional(),
  parameters: z.record(z.string(), z.object({ string_value: z.string() }).strict()).default({}),
  model_warmup: z.array(warmupSchema).default([]),
  response_cache: z.object({ enable: z.boolean().default(false) }).strict().optional(),
  batch_input: z.array(batchInputSchema).default([]),
  optimization: ignored, model_transaction_policy: ignored,
  metric_tags: ignored, cc_model_filenames: ignored, model_operations: ignored, model_repository_agents: ignored,
}).strict();

export const modelConfigSchema = modelConfigSchemaBase.superRefine((config, ctx) => {
  const issue = (message: string, at: (string | number)[]) => ctx.addIssue({ code: 'custom', message, path: at });
  const backend = resolveBackend(config);
  if (backend === null) {
    issue(`unknown backend ${JSON.stringify(config.backend ?? config.platform ?? '')}: expected backend ${BACKENDS.filter((b) => b !== 'ensemble').join(' or ')}, or platform onnxruntime_onnx or ensemble`, [config.backend === undefined ? 'platform' : 'backend']);
  }
  if (backend === 'ensemble' && config.ensemble_scheduling === undefined) issue('an ensemble needs ensemble_scheduling', ['platform']);
  if (backend !== 'ensemble' && config.ensemble_scheduling !== undefined) issue('ensemble_scheduling needs platform: "ensemble"', ['ensemble_scheduling']);
  if (backend === 'ensemble' && config.instance_group.length > 0) issue('an ensemble has no instance groups: its steps run on their own models', ['instance_group']);
  if (backend === 'ensemble' && config.dynamic_batching !== undefined) issue('an ensemble has no dynamic batcher: its steps batch on their own models', ['dynamic_batching']);
  if (backend === 'ensemble' && config.response_cache?.enable === true) issue('not supported on an ensemble: enable it on its steps\' models', ['response_cache', 'enable']);
  if (backend === 'ensemble' && config.batch_input.length > 0) issue('an ensemble has no batch inputs: its steps batch on their own models', ['batch_input']);
  config.batch_input.forEach((spec, i) => {
    if (!config.input.some((input) => input.name === spec.source_input[0])) issue(`source_input ${JSON.stringify(spec.source_input[0])} is not an input of the model`, ['batch_input', i, 'source_input']);
    spec.target_name.forEach((target, j) => {
      if (config.input.some((input) => input.name === target)) issue(`target_name ${JSON.stringify(target)} is an input the requests give; a batch input must have a name of its own`, ['batch_input', i, 'target_name', j]);
    });
  });
  if (backend === 'ensemble' && config.model_warmup.length > 0) issue('an ensemble has no warmup: its steps warm up on their own models', ['model_warmup']);
  config.model_warmup.forEach((sample, i) => {
    if (config.max_batch_size === 0 && sample.batch_size !== 1) issue('must be 1 for a model without batching', ['model_warmup', i, 'batch_size']);
    if (config.max_batch_size > 0 && sample.batch_size > config.max_batch_size) issue(`must be at most max_batch_size ${config.max_batch_size}`, ['model_warmup', i, 'batch_size']);
  });
  const names = new Set<string>();
  for (const [kind, tensors] of [['input', config.input], ['output', config.output]] as const) {
    tensors.forEach((tensor, i) => {
      if (names.has(`${kind}:${tensor.name}`)) issue(`duplicate ${kind} name ${JSON.stringify(tensor.name)}`, [kind, i, 'name']);
      names.add(`${kind}:${tensor.name}`);
    });
  }
  if (config.sequence_batching !== undefined) checkSequenceBatching(config, backend, issue);
  const batching = config.dynamic_batching;
  if (batching === undefined) return;
  if (config.max_batch_size === 0) issue('dynamic_batching needs max_batch_size > 0', ['dynamic_batching']);
  batching.preferred_batch_size.forEach((size, i) => {
    if (config.max_batch_size > 0 && size > config.max_batch_size) {
      issue(`preferred batch size ${size} is larger than max_batch_size ${config.max_batch_size}`, ['dynamic_batching', 'preferred_batch_size', i]);
    }
  });
  if (batching.priority_levels > 0 && (batching.default_priority_level < 1 || batching.default_priority_level > batching.priority_levels)) {
    issue(`must be in [1, ${batching.priority_levels}]`, ['dynamic_batching', 'default_priority_level']);
  }
  if (batching.priority_levels === 0 && batching.default_priority_level !== 0) {
    issue('default_priority_level needs priority_levels', ['dynamic_batching', 'default_priority_level']);
  }
  if (batching.preserve_ordering && batching.priority_levels > 1) {
    issue('preserve_ordering allows at most one priority level', ['dynamic_batching', 'preserve_ordering']);
  }
  if (batching.preserve_ordering && batching.default_queue_policy.timeout_action === 'DELAY') {
    issue('preserve_ordering does not allow timeout_action DELAY', ['dynamic_batching', 'default_queue_policy', 'timeout_action']);
  }
  for (const level of Object.keys(batching.priority_queue_policy)) {
    if (Number(level) < 1 || Number(level) > batching.priority_levels) {
      issue(`priority_queue_policy level ${level} is not in [1, ${batching.priority_levels}]`, ['dynamic_batching', 'priority_queue_policy', level]);
    }
  }
});

type Issue = (message: string, at: (string | number)[]) => void;

/** Triton's checks of sequence_batching (model_config_utils.cc, sequence_batch_scheduler.cc). */
function checkSequenceBatching(config: z.infer<typeof modelConfigSchemaBase>, backend: BackendName | null, issue: Issue) {
  const sequence = config.sequence_batching!;
  const at = (...rest: (string | number)[]) => ['sequence_batching', ...rest];
  if (backend === 'ensemble') issue('an ensemble has no sequence batcher: its steps schedule on their own models', at());
  if (config.dynamic_batching !== undefined) issue('a model has one scheduler: dynamic_batching or sequence_batching, not both', at());
  if (sequence.direct !== undefined && sequence.oldest !== undefined) issue('one strategy: direct or oldest, not both', at('oldest'));
  if (sequence.iterative_sequence) issue('iterative sequences are not supported', at('iterative_sequence'));
  if (config.response_cache?.enable === true) issue('a stateful model\'s responses depend on its sequence: the response cache cannot serve them', ['response_cache', 'enable']);
  const oldest = sequence.oldest;
  oldest?.preferred_batch_size.forEach((size, i) => {
    if (size > Math.max(1, config.max_batch_size)) issue(`preferred batch size ${size} is larger than max_batch_size ${config.max_batch_size}`, at('oldest', 'preferred_batch_size', i));
  });
  const inputNames = new Set(config.input.map((input) => input.name));
  const implicitNames = new Set<string>();
  const claim = (name: string, where: (string | number)[]) => {
    if (inputNames.has(name)) issue(`'${name}' is an input the requests give; the sequence batcher gives this one`, where);
    else if (implicitNames.has(name)) issue(`'${name}' is given twice by the sequence batcher`, where);
    implicitNames.add(name);
  };
  const seenKinds = new Set<ControlKind>();
  sequence.control_input.forEach((input, i) => {
    claim(input.name, at('control_input', i, 'name'));
    if (input.control.length > 1) issue(`control input '${input.name}' must have exactly one control`, at('control_input', i, 'control'));
    input.control.forEach((control, j) => {
      const where = at('control_input', i, 'control', j);
      if (seenKinds.has(control.kind)) issue(`sequence batching specifies multiple ${control.kind} tensors`, [...where, 'kind']);
      seenKinds.add(control.kind);
      const given = [['int32_false_true', control.int32_false_true], ['fp32_false_true', control.fp32_false_true], ['bool_false_true', control.bool_false_true]] as const;
      const set = given.filter(([, values]) => values.length > 0);
      if (control.kind === 'CONTROL_SEQUENCE_CORRID') {
        if (set.length > 0) issue(`${control.kind} takes data_type, not ${set[0][0]}`, [...where, set[0][0]]);
        if (control.data_type === undefined) issue(`${control.kind} must specify data_type`, [...where, 'data_type']);
        else if (!CORRID_DATATYPES.includes(control.data_type)) issue(`${control.kind} data_type must be one of ${CORRID_DATATYPES.join(', ')}`, [...where, 'data_type']);
        return;
      }
      if (control.data_type !== undefined) issue(`${control.kind} takes one of int32_false_true, fp32_false_true or bool_false_true, not data_type`, [...where, 'data_type']);
      if (set.length !== 1) issue(`${control.kind} must specify exactly one of int32_false_true, fp32_false_true or bool_false_true`, where);
      else if (set[0][1].length !== 2) issue(`must have exactly 2 entries (false, true), got ${set[0][1].length}`, [...where, set[0][0]]);
    });
  });
  const outputNames = new Set<string>();
  sequence.state.forEach((state, i) => {
    claim(state.input_name, at('state', i, 'input_name'));
    if (outputNames.has(state.output_name)) issue(`state output '${state.output_name}' is named twice`, at('state', i, 'output_name'));
    outputNames.add(state.output_name);
    const declared = config.output.find((output) => output.name === state.output_name);
    if (declared !== undefined && declared.data_type !== state.data_type) issue(`state output '${state.output_name}' is ${state.data_type} but output '${declared.name}' is ${declared.data_type}`, at('state', i, 'data_type'));
    const initial = state.initial_state[0];
    if (initial === undefined) return;
    const where = at('state', i, 'initial_state', 0);
    if (initial.data_type !== state.data_type) issue(`the data type of 'initial_state' of state '${state.input_name}' does not match the state data type`, [...where, 'data_type']);
    if (initial.dims.length !== state.dims.length) issue(`'initial_state' has ${initial.dims.length} dims but state '${state.input_name}' has ${state.dims.length}`, [...where, 'dims']);
    else initial.dims.forEach((dim, d) => {
      if (state.dims[d] !== -1 && state.dims[d] !== dim) issue(`'initial_state' dim ${dim} does not match the state's ${state.dims[d]}`, [...where, 'dims', d]);
    });
  });
}

type ParsedConfig = z.infer<typeof modelConfigSchema>;

/** A validated config, normalized as Triton does: name set, backend resolved, defaults filled. */
export type ModelConfig = Omit<ParsedConfig, 'name'> & { name: string; backend: BackendName };

function resolveBackend(config: { backend?: string; platform?: string }): BackendName | null {
  if (config.backend !== undefined) return (BACKENDS as readonly string[]).includes(config.backend) ? config.backend as BackendName : null;
  if (config.platform !== undefined) return PLATFORM_BACKENDS[config.platform] ?? null;
  return null;
}

/** Triton's max_sequence_idle_microseconds when the config gives none (or 0). */
export const DEFAULT_MAX_SEQUENCE_IDLE_US = 1_000_000;

export class ModelConfigError extends Error {
  override name = 'ModelConfigError';
}

/** The field shape pbtxt cannot express by itself. */
const PBTXT_SHAPE = {
  repeatedFields: new Set(['input', 'output', 'dims', 'shape', 'instance_group', 'gpus', 'preferred_batch_size', 'step', 'versions', 'model_warmup', 'batch_input', 'target_name', 'source_input', 'control_input', 'control', 'int32_false_true', 'fp32_false_true', 'bool_false_true', 'state', 'initial_state']),
  mapFields: new Set(['input_map', 'output_map', 'parameters', 'priority_queue_policy', 'metric_tags', 'cc_model_filenames', 'inputs']),
};

/** `input[0].data_type`, the way users write it. */
function fieldName(at: readonly PropertyKey[]): string {
  let name = '';
  for (const segment of at) {
    if (typeof segment === 'number') name += `[${segment}]`;
    else name += name === '' ? String(segment) : `.${String(segment)}`;
  }
  return name === '' ? '(root)' : name;
}

/** Validates raw config data; lineOf gives the line of a field path (or its nearest parent). */
export function validateModelConfig(raw: unknown, dirName: string, file: string, lineOf: (at: readonly PropertyKey[]) => number): ModelConfig {
  const result = modelConfigSchema.safeParse(raw ?? {});
  if (!result.success) {
    throw new ModelConfigError(result.error.issues.map((issue) => {
      // An unknown field is reported at its parent; point at the field itself.
      const at = issue.code === 'unrecognized_keys' ? [...issue.path, issue.keys[0]] : issue.path;
      return `${file}:${lineOf(at)}: ${fieldName(at)}: ${issue.message}`;
    }).join('\n'));
  }
  const config = result.data;
  if (config.name !== undefined && config.name !== dirName) {
    throw new ModelConfigError(`${file}:${lineOf(['name'])}: name: ${JSON.stringify(config.name)} must equal the model's folder name ${JSON.stringify(dirName)}`);
  }
  const backend = resolveBackend(config)!;
  const dynamicBatching = config.dynamic_batching;
  if (dynamicBatching !== undefined && dynamicBatching.preferred_batch_size.length === 0) {
    dynamicBatching.preferred_batch_size = [config.max_batch_size];
  }
  const sequence = config.sequence_batching;
  if (sequence !== undefined) {
    if (sequence.max_sequence_idle_microseconds === 0) sequence.max_sequence_idle_microseconds = DEFAULT_MAX_SEQUENCE_IDLE_US;
    if (sequence.direct === undefined && sequence.oldest === undefined) sequence.direct = { max_queue_delay_microseconds: 0, minimum_slot_utilization: 0 };
    if (sequence.oldest !== undefined && sequence.oldest.preferred_batch_size.length === 0) sequence.oldest.preferred_batch_size = [Math.max(1, config.max_batch_size)];
  }
  const instanceGroup = backend === 'ensemble' || config.instance_group.length > 0
    ? config.instance_group
    : [{ count: 1, kind: 'KIND_CPU' as const, gpus: [] }];
  return { ...config, name: dirName, backend, instance_group: instanceGroup };
}

export function parseConfigText(text: string, file: string, dirName: string): ModelConfig {
  if (file.endsWith('.pbtxt')) {
    let parsed;
    try {
      parsed = parsePbtxt(text, PBTXT_SHAPE);
    } catch (err) {
      if (err instanceof PbtxtError) throw new ModelConfigError(`${file}:${err.line}: ${err.message}`);
      throw err;
    }
    return validateModelConfig(parsed.value, dirName, file, (at) => {
      for (let n = at.length; n > 0; n--) {
        const line = parsed.lines.get(at.slice(0, n).map(String).join('.'));
        if (line !== undefined) return line;
      }
      return 1;
    });
  }
  const lineCounter = new LineCounter();
  const doc = parseDocument(text, { lineCounter });
  if (doc.errors.length > 0) {
    const error = doc.errors[0];
    throw new ModelConfigError(`${file}:${error.linePos?.[0].line ?? 1}: invalid YAML: ${error.message.split('\n')[0]}`);
  }
  return validateModelConfig(doc.toJS(), dirName, file, (at) => {
    for (let n = at.length; n > 0; n--) {
      const node = doc.getIn(at.slice(0, n) as unknown[], true);
      if (isNode(node) && node.range) return lineCounter.linePos(node.range[0]).line;
      // A key whose value is missing: find the pair's key.
    }
    return 1;
  });
}

export const CONFIG_FILES = ['config.pbtxt', 'config.yaml'] as const;

/** Reads <modelDir>/config.pbtxt or config.yaml (exactly one of them); errors name it as shownFile (the path itself by default). */
export function readModelConfig(modelDir: string, configFile: string, shownFile = configFile): ModelConfig {
  let text: string;
  try {
    text = readFileSync(configFile, 'utf8');
  } catch (err) {
    throw new ModelConfigError(`${shownFile}: cannot read: ${(err as NodeJS.ErrnoException).code ?? 'error'}`);
  }
  // The name's extension picks the parser (shownFile keeps it); the shown name is what errors say.
  return parseConfigText(text, shownFile, path.basename(modelDir));
}
