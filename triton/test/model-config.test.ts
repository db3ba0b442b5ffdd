import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, test } from 'node:test';
import { ModelConfigError, parseConfigText } from '../model-config.ts';
import { parsePbtxt } from '../pbtxt.ts';
import { listModelNames, readModelSource } from '../repository-scan.ts';

const DIGITS_PBTXT = `# a Triton config, as Triton's docs write them
name: "digits"
platform: "onnxruntime_onnx"
max_batch_size: 128
input [
  {
    name: "pixels"
    data_type: TYPE_FP32
    dims: [ 64 ]
    reshape: { shape: [ 1, 8, 8 ] }
  }
]
output [ { name: "probabilities", data_type: TYPE_FP32, dims: [ 10 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
version_policy: { specific: { versions: [ 1, 3 ] } }
dynamic_batching {
  preferred_batch_size: [ 8, 16 ]
  max_queue_delay_microseconds: 500
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 1000 allow_timeout_override: true max_queue_size: 64 }
  priority_queue_policy { key: 1 value: { max_queue_size: 8 } }
}
`;

describe('config.pbtxt', () => {
  test('every field of the issue parses into the normalized config', () => {
    const config = parseConfigText(DIGITS_PBTXT, 'digits/config.pbtxt', 'digits');
    assert.equal(config.name, 'digits');
    assert.equal(config.backend, 'onnxruntime');
    assert.equal(config.max_batch_size, 128);
    assert.deepEqual(config.input, [{ name: 'pixels', data_type: 'TYPE_FP32', dims: [64], reshape: { shape: [1, 8, 8] }, allow_ragged_batch: false, optional: false }]);
    assert.deepEqual(config.output, [{ name: 'probabilities', data_type: 'TYPE_FP32', dims: [10] }]);
    assert.deepEqual(config.instance_group, [{ count: 2, kind: 'KIND_CPU', gpus: [] }]);
    assert.deepEqual(config.version_policy, { specific: { versions: [1, 3] } });
    assert.deepEqual(config.dynamic_batching, {
      preferred_batch_size: [8, 16],
      max_queue_delay_microseconds: 500,
      preserve_ordering: false,
      priority_levels: 2,
      default_priority_level: 2,
      default_queue_policy: { timeout_action: 'DELAY', default_timeout_microseconds: 1000, allow_timeout_override: true, max_queue_size: 64 },
      priority_queue_policy: { 1: { timeout_action: 'REJECT', default_timeout_microseconds: 0, allow_timeout_override: false, max_queue_size: 8 } },
    });
  });

  test('an ensemble with steps, input_map and output_map', () => {
    const config = parseConfigText(`
name: "pipe"
platform: "ensemble"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_UINT8 dims: [ 64 ] } ]
output [ { name: "LABEL" data_type: TYPE_STRING dims: [ 1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "pre" model_version: -1 input_map { key: "in" value: "RAW" } output_map { key: "out" value: "x" } },
    { model_name: "cls" input_map { key: "pixels" value: "x" } output_map { key: "probabilities" value: "LABEL" } }
  ]
}`, 'pipe/config.pbtxt', 'pipe');
    assert.equal(config.backend, 'ensemble');
    assert.deepEqual(config.instance_group, []);
    assert.deepEqual(config.ensemble_scheduling!.step.map((s) => [s.model_name, s.model_version, s.input_map, s.output_map]), [
      ['pre', -1, { in: 'RAW' }, { out: 'x' }],
      ['cls', -1, { pixels: 'x' }, { probabilities: 'LABEL' }],
    ]);
  });

  test('defaults: latest version, one CPU instance, preferred size = max_batch_size', () => {
    const config = parseConfigText('backend: "script"\nmax_batch_size: 4\ndynamic_batching { }', 'm/config.pbtxt', 'm');
    assert.deepEqual(config.version_policy, { latest: { num_versions: 1 } });
    assert.deepEqual(config.instance_group, [{ count: 1, kind: 'KIND_CPU', gpus: [] }]);
    assert.deepEqual(config.dynamic_batching!.preferred_batch_size, [4]);
  });

  test('text format details: comments, adjacent strings, < > messages, separators', () => {
    const { value } = parsePbtxt('a: "x" \'y\' # c\nb < c: 1; d: -2.5e1 >, e: [true, f, KIND_CPU]', { repeatedFields: new Set(['e']), mapFields: new Set() });
    assert.deepEqual(value, { a: 'xy', b: { c: 1, d: -25 }, e: [true, false, 'KIND_CPU'] });
  });

  const errorCases: Array<[string, string, RegExp]> = [
    ['unknown datatype', 'backend: "script"\ninput [\n  { name: "a"\n    data_type: TYPE_FLOAT\n    dims: [1] }\n]', /^m\/config\.pbtxt:4: input\[0\]\.data_type: /],
    ['unknown field', 'backend: "script"\n\nmax_batch: 3', /^m\/config\.pbtxt:3: max_batch: Unrecognized key/],
    ['preferred size over max', 'backend: "script"\nmax_batch_size: 4\ndynamic_batching {\n  preferred_batch_size: [ 2, 8 ]\n}', /^m\/config\.pbtxt:4: dynamic_batching\.preferred_batch_size\[1\]: preferred batch size 8 is larger than max_batch_size 4/],
    ['default priority out of range', 'backend: "script"\nmax_batch_size: 4\ndynamic_batching { priority_levels: 2\n default_priority_level: 3 }', /^m\/config\.pbtxt:4: dynamic_batching\.default_priority_level: must be in \[1, 2\]/],
    ['preserve_ordering with DELAY', 'backend: "script"\nmax_batch_size: 4\ndynamic_batching {\npreserve_ordering: true\ndefault_queue_policy { timeout_action: DELAY } }', /:5: dynamic_batching\.default_queue_policy\.timeout_action: preserve_ordering does not allow timeout_action DELAY/],
    ['unknown backend', 'backend: "tensorflow"', /^m\/config\.pbtxt:1: backend: unknown backend "tensorflow"/],
    ['name differs from folder', 'name: "other"\nbackend: "script"', /^m\/config\.pbtxt:1: name: "other" must equal the model's folder name "m"/],
    ['a syntax error', 'backend: "script"\ninput [ { name: "a" ', /^m\/config\.pbtxt:2: unexpected end of file/],
    ['a field given twice', 'backend: "script"\nmax_batch_size: 1\nmax_batch_size: 2', /^m\/config\.pbtxt:3: max_batch_size is set more than once/],
    ['ensemble with instances', 'platform: "ensemble"\nensemble_scheduling { step [ { model_name: "a" } ] }\ninstance_group [ { count: 2 } ]', /:3: instance_group: an ensemble has no instance groups/],
  ];
  for (const [name, text, expected] of errorCases) {
    test(`error names file, line and field: ${name}`, () => {
      assert.throws(() => parseConfigText(text, 'm/config.pbtxt', 'm'), (err: Error) => {
        assert.ok(err instanceof ModelConfigError, String(err));
        assert.match(err.message, expected);
        return true;
      });
    });
  }
});

describe('sequence_batching', () => {
  const HEAD = 'backend: "script"\nmax_batch_size: 4\ninput [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n';
  const parse = (body: string) => parseConfigText(`${HEAD}sequence_batching {\n${body}\n}\n`, 'm/config.pbtxt', 'm');
  /** The one error a body gives, as `line: field: message`. */
  const errorOf = (body: string) => {
    try {
      parse(body);
    } catch (err) {
      assert.ok(err instanceof ModelConfigError, String(err));
      return err.message.replace(/^m\/config\.pbtxt:/, '');
    }
    assert.fail(`accepted: ${body}`);
  };

  test('defaults as Triton: direct, 1 s idle; oldest takes preferred size max_batch_size; every field parses', () => {
    const plain = parse('');
    assert.equal(plain.sequence_batching!.max_sequence_idle_microseconds, 1_000_000);
    assert.deepEqual(plain.sequence_batching!.direct, { max_queue_delay_microseconds: 0, minimum_slot_utilization: 0 });
    const full = parse(`max_sequence_idle_microseconds: 5000
oldest { max_candidate_sequences: 8 max_queue_delay_microseconds: 100 }
control_input [
  { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
  { name: "E" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },
  { name: "R" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
  { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
]
state [ { input_name: "H_IN" output_name: "H_OUT" data_type: TYPE_FP32 dims: [ 2 ] initial_state: { name: "h0" data_type: TYPE_FP32 dims: [ 2 ] data_file: "h0.bin" } } ]`);
    const sequence = full.sequence_batching!;
    assert.equal(sequence.max_sequence_idle_microseconds, 5000);
    assert.equal(sequence.direct, undefined);
    assert.deepEqual(sequence.oldest, { max_candidate_sequences: 8, preferred_batch_size: [4], max_queue_delay_microseconds: 100, preserve_ordering: false });
    assert.deepEqual(sequence.control_input.map((input) => input.control[0].kind), ['CONTROL_SEQUENCE_START', 'CONTROL_SEQUENCE_END', 'CONTROL_SEQUENCE_READY', 'CONTROL_SEQUENCE_CORRID']);
    assert.deepEqual(sequence.state[0].initial_state[0], { name: 'h0', data_type: 'TYPE_FP32', dims: [2], data_file: 'h0.bin' });
  });

  test('errors name the line and the field', () => {
    assert.equal(errorOf('direct { }\noldest { }'), '6: sequence_batching.oldest: one strategy: direct or oldest, not both');
    assert.equal(errorOf('control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID } ] } ]'),
      '5: sequence_batching.control_input[0].control[0].data_type: CONTROL_SEQUENCE_CORRID must specify data_type');
    assert.equal(errorOf('control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ]'),
      '5: sequence_batching.control_input[0].control[0].data_type: CONTROL_SEQUENCE_CORRID data_type must be one of TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32, TYPE_STRING');
    assert.equal(errorOf('control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] fp32_false_true: [ 0, 1 ] } ] } ]'),
      '5: sequence_batching.control_input[0].control[0]: CONTROL_SEQUENCE_START must specify exactly one of int32_false_true, fp32_false_true or bool_false_true');
    assert.equal(errorOf('control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 1 ] } ] } ]'),
      '5: sequence_batching.control_input[0].control[0].int32_false_true: must have exactly 2 entries (false, true), got 1');
    assert.equal(errorOf('control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }, { name: "B" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] } ]'),
      '5: sequence_batching.control_input[1].control[0].kind: sequence batching specifies multiple CONTROL_SEQUENCE_READY tensors');
    assert.equal(errorOf('control_input [ { name: "INPUT" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] } ]'),
      "5: sequence_batching.control_input[0].name: 'INPUT' is an input the requests give; the sequence batcher gives this one");
    assert.equal(errorOf('state [ { input_name: "S" output_name: "T" data_type: TYPE_FP32 dims: [ 1 ] initial_state: { name: "z" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } ]'),
      "5: sequence_batching.state[0].initial_state[0].data_type: the data type of 'initial_state' of state 'S' does not match the state data type");
    assert.equal(errorOf('state [ { input_name: "S" output_name: "T" data_type: TYPE_FP32 dims: [ 1 ] initial_state: { name: "z" data_type: TYPE_FP32 dims: [ 1 ] } } ]'),
      '5: sequence_batching.state[0].initial_state[0]: expected exactly one of zero_data: true, data_file');
    assert.equal(errorOf('oldest { preferred_batch_size: [ 8 ] }'),
      '5: sequence_batching.oldest.preferred_batch_size[0]: preferred batch size 8 is larger than max_batch_size 4');
    assert.equal(errorOf('iterative_sequence: true'), '5: sequence_batching.iterative_sequence: iterative sequences are not supported');
    assert.throws(() => parseConfigText(`${HEAD}dynamic_batching { }\nsequence_batching { }\n`, 'm/config.pbtxt', 'm'),
      /m\/config\.pbtxt:5: sequence_batching: a model has one scheduler: dynamic_batching or sequence_batching, not both/);
  });
});

describe('config.yaml', () => {
  test('the same fields as config.pbtxt', () => {
    const config = parseConfigText(`backend: script
max_batch_size: 8
input:
  - { name: x, data_type: TYPE_INT64, dims: [-1], allow_ragged_batch: true }
output:
  - { name: y, data_type: TYPE_STRING, dims: [1] }
version_policy: { all: {} }
dynamic_batching: { max_queue_delay_microseconds: 100, preserve_ordering: true }
`, 'm/config.yaml', 'm');
    assert.equal(config.input[0].allow_ragged_batch, true);
    assert.deepEqual(config.version_policy, { all: {} });
    assert.equal(config.dynamic_batching!.preserve_ordering, true);
  });

  test('errors name file, line and field', () => {
    assert.throws(() => parseConfigText('backend: script\nmax_batch_size: 8\ninput:\n  - name: x\n    data_type: TYPE_INT64\n    dims: [a]\n', 'm/config.yaml', 'm'),
      /m\/config\.yaml:6: input\[0\]\.dims\[0\]: /);
    assert.throws(() => parseConfigText('backend: script\nmax_batch_size: -1\n', 'm/config.yaml', 'm'), /m\/config\.yaml:2: max_batch_size: /);
  });
});

describe('repository scan', () => {
  const repo = mkdtempSync(path.join(os.tmpdir(), 'conduit-repo-'));
  after(() => rmSync(repo, { recursive: true, force: true }));
  const makeModel = (name: string, config: string, versions: string[], file = 'config.pbtxt') => {
    mkdirSync(path.join(repo, name));
    writeFileSync(path.join(repo, name, file), config);
    for (const version of versions) mkdirSync(path.join(repo, name, version));
  };
  makeModel('latest2', 'backend: "script"\nversion_policy: { latest: { num_versions: 2 } }', ['1', '2', '10', '01', 'notes']);
  makeModel('all', 'backend: "script"\nversion_policy: { all: { } }', ['3', '1']);
  makeModel('specific', 'backend: script\nversion_policy: { specific: { versions: [2, 5] } }', ['1', '2', '3'], 'config.yaml');
  makeModel('noversions', 'backend: "script"', []);
  mkdirSync(path.join(repo, 'llm-checkpoint'));

  test('model folders are those with a config', () => {
    assert.deepEqual(listModelNames(repo), ['all', 'latest2', 'noversions', 'specific']);
  });

  test('version policies pick versions; 01 and non-numeric folders are ignored', () => {
    assert.deepEqual(readModelSource(repo, 'latest2').versions, [2, 10]);
    assert.deepEqual(readModelSource(repo, 'all').versions, [1, 3]);
    assert.deepEqual(readModelSource(repo, 'specific').versions, [2]);
  });

  test('a model without versions is an error naming its folder', () => {
    assert.throws(() => readModelSource(repo, 'noversions'), /noversions: no version folders/);
  });
});
