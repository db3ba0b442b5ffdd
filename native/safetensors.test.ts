import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  bf16BitsToNumber,
  f16BitsToNumber,
  readCheckpointTensors,
  readSafetensorsHeader,
  readTensorF64,
} from './safetensors.ts';

/** Builds a safetensors file by hand so these tests do not depend on our writer. */
function buildFile(header: unknown, data: Buffer, declaredJsonBytes?: number): Buffer {
  const json = Buffer.from(JSON.stringify(header), 'utf8');
  const length = Buffer.alloc(8);
  length.writeBigUInt64LE(BigInt(declaredJsonBytes ?? json.length));
  return Buffer.concat([length, json, data]);
}

function withTempDir(fn: (dir: string) => void): void {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'safetensors-test-'));
  try {
    fn(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const twoTensorHeader = {
  __metadata__: { format: 'pt' },
  a: { dtype: 'F32', shape: [2], data_offsets: [0, 8] },
  b: { dtype: 'BF16', shape: [1, 2], data_offsets: [8, 12] },
};

function twoTensorData(): Buffer {
  const data = Buffer.alloc(12);
  data.writeFloatLE(1.5, 0);
  data.writeFloatLE(-2.25, 4);
  data.writeUInt16LE(0x3f80, 8); // 1.0
  data.writeUInt16LE(0xc040, 10); // -3.0
  return data;
}

test('reads header fields with absolute offsets and widens F32 and BF16', () => {
  withTempDir((dir) => {
    const file = path.join(dir, 'x.safetensors');
    const bytes = buildFile(twoTensorHeader, twoTensorData());
    writeFileSync(file, bytes);
    const header = readSafetensorsHeader(file);
    const dataStart = bytes.length - 12;
    assert.equal(header.headerBytes, dataStart);
    assert.deepEqual(header.metadata, { format: 'pt' });
    assert.deepEqual(header.tensors.get('a'), { dtype: 'F32', shape: [2], dataBegin: dataStart, dataEnd: dataStart + 8 });
    assert.deepEqual([...readTensorF64(file, header, 'a')], [1.5, -2.25]);
    assert.deepEqual([...readTensorF64(file, header, 'b')], [1, -3]);
    assert.throws(() => readTensorF64(file, header, 'c'), /x\.safetensors: no tensor "c"/);
  });
});

test('truncated file names the file and the tensor', () => {
  withTempDir((dir) => {
    const file = path.join(dir, 'cut.safetensors');
    const bytes = buildFile(twoTensorHeader, twoTensorData());
    writeFileSync(file, bytes.subarray(0, bytes.length - 1));
    assert.throws(() => readSafetensorsHeader(file), (err: Error) => {
      assert.ok(err.message.startsWith(file), err.message);
      assert.match(err.message, /tensor "b".*truncated/);
      return true;
    });
  });
});

test('malformed headers are errors that start with the path and name the field', () => {
  const cases: Array<[string, Buffer, RegExp]> = [
    ['short', Buffer.alloc(5), /too short/],
    ['huge length', buildFile({}, Buffer.alloc(0), 2 ** 40), /exceeds/],
    ['length past end', buildFile({}, Buffer.alloc(0), 4096), /past the end/],
    ['not json', Buffer.concat([Buffer.from([4, 0, 0, 0, 0, 0, 0, 0]), Buffer.from('{oops')]), /not valid JSON/],
    ['array header', buildFile([1, 2], Buffer.alloc(0)), /must be a JSON object/],
    ['bad dtype', buildFile({ t: { dtype: 'F99', shape: [1], data_offsets: [0, 4] } }, Buffer.alloc(4)), /tensor "t": dtype "F99"/],
    ['bad shape', buildFile({ t: { dtype: 'F32', shape: [-1], data_offsets: [0, 4] } }, Buffer.alloc(4)), /tensor "t": shape/],
    ['reversed offsets', buildFile({ t: { dtype: 'F32', shape: [0], data_offsets: [4, 0] } }, Buffer.alloc(4)), /tensor "t": data_offsets/],
    ['wrong size', buildFile({ t: { dtype: 'F16', shape: [3], data_offsets: [0, 4] } }, Buffer.alloc(4)), /tensor "t".*needs 6/],
    [
      'overlap',
      buildFile(
        { s: { dtype: 'F32', shape: [2], data_offsets: [0, 8] }, t: { dtype: 'F32', shape: [1], data_offsets: [4, 8] } },
        Buffer.alloc(8),
      ),
      /tensor "t" overlaps tensor "s"/,
    ],
    ['metadata type', buildFile({ __metadata__: { n: 1 } }, Buffer.alloc(0)), /__metadata__\.n must be a string/],
  ];
  withTempDir((dir) => {
    for (const [label, bytes, pattern] of cases) {
      const file = path.join(dir, `${label.replace(/ /g, '-')}.safetensors`);
      writeFileSync(file, bytes);
      assert.throws(() => readSafetensorsHeader(file), (err: Error) => {
        assert.ok(err.message.startsWith(file), `${label}: ${err.message}`);
        assert.match(err.message, pattern, label);
        return true;
      });
    }
  });
});

test('a missing file is an error naming it', () => {
  assert.throws(() => readSafetensorsHeader('/nonexistent/model.safetensors'), /^Error: \/nonexistent\/model\.safetensors: cannot open/);
});

test('bf16 widening is the upper half of an fp32', () => {
  assert.equal(bf16BitsToNumber(0x0000), 0);
  assert.ok(Object.is(bf16BitsToNumber(0x8000), -0));
  assert.equal(bf16BitsToNumber(0x4049), 3.140625);
  assert.equal(bf16BitsToNumber(0x7f80), Infinity);
  assert.equal(bf16BitsToNumber(0xff80), -Infinity);
  assert.ok(Number.isNaN(bf16BitsToNumber(0x7fc0)));
  assert.equal(bf16BitsToNumber(0x0001), 2 ** -133); // smallest subnormal
});

test('fp16 widening covers normals, subnormals, infinities and NaN', () => {
  assert.equal(f16BitsToNumber(0x3c00), 1);
  assert.equal(f16BitsToNumber(0xc000), -2);
  assert.equal(f16BitsToNumber(0x7bff), 65504);
  assert.equal(f16BitsToNumber(0x0400), 2 ** -14); // smallest normal
  assert.equal(f16BitsToNumber(0x0001), 2 ** -24); // smallest subnormal
  assert.equal(f16BitsToNumber(0x03ff), 1023 * 2 ** -24);
  assert.ok(Object.is(f16BitsToNumber(0x8000), -0));
  assert.equal(f16BitsToNumber(0x7c00), Infinity);
  assert.equal(f16BitsToNumber(0xfc00), -Infinity);
  assert.ok(Number.isNaN(f16BitsToNumber(0x7e00)));
  assert.equal(f16BitsToNumber(0x3555), 0.333251953125);
});

test('lists a single-file checkpoint', () => {
  withTempDir((dir) => {
    writeFileSync(path.join(dir, 'model.safetensors'), buildFile(twoTensorHeader, twoTensorData()));
    const { tensors, headers } = readCheckpointTensors(dir);
    assert.deepEqual([...tensors.keys()], ['a', 'b']);
    assert.equal(tensors.get('b')?.file, path.join(dir, 'model.safetensors'));
    assert.equal(headers.size, 1);
  });
});

test('lists a sharded checkpoint through weight_map, and reports missing shards and tensors', () => {
  withTempDir((dir) => {
    const shard1 = 'model-00001-of-00002.safetensors';
    const shard2 = 'model-00002-of-00002.safetensors';
    writeFileSync(path.join(dir, shard1), buildFile({ a: twoTensorHeader.a }, twoTensorData().subarray(0, 8)));
    writeFileSync(
      path.join(dir, shard2),
      buildFile({ b: { dtype: 'BF16', shape: [1, 2], data_offsets: [0, 4] } }, twoTensorData().subarray(8)),
    );
    const indexFile = path.join(dir, 'model.safetensors.index.json');
    const writeIndex = (weightMap: Record<string, string>) =>
      writeFileSync(indexFile, JSON.stringify({ metadata: { total_size: 12 }, weight_map: weightMap }));

    writeIndex({ a: shard1, b: shard2 });
    const { tensors, headers } = readCheckpointTensors(dir);
    assert.equal(tensors.get('a')?.file, path.join(dir, shard1));
    assert.equal(tensors.get('b')?.file, path.join(dir, shard2));
    assert.equal(headers.size, 2);
    const b = tensors.get('b')!;
    assert.deepEqual([...readTensorF64(b.file, headers.get(b.file)!, 'b')], [1, -3]);

    writeIndex({ a: shard1, b: 'model-00003-of-00002.safetensors' });
    assert.throws(() => readCheckpointTensors(dir), /index\.json: shard model-00003-of-00002\.safetensors \(holding "b"\) does not exist/);

    writeIndex({ a: shard1, b: shard1 });
    assert.throws(() => readCheckpointTensors(dir), /weight_map puts "b" in model-00001-of-00002\.safetensors, which lacks it/);

    writeIndex({ a: '../elsewhere.safetensors' });
    assert.throws(() => readCheckpointTensors(dir), /weight_map\.a must be a file name/);
  });
});

test('an empty directory is an error naming what is missing', () => {
  withTempDir((dir) => {
    assert.throws(() => readCheckpointTensors(dir), /neither model\.safetensors nor model\.safetensors\.index\.json exists/);
  });
});
