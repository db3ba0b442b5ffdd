// Writes a small ONNX model (a list of nodes, FP32 initializers, typed inputs and outputs) with
// protobufjs over tools/onnx/onnx.proto, so the models in models/ need no Python.
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import protobuf from 'protobufjs';

const ONNX_FLOAT = 1;
const IR_VERSION = 8;
export const OPSET_VERSION = 13;

export interface OnnxNode {
  opType: string;
  inputs: string[];
  outputs: string[];
  /** Integer attributes (axis, transB, ...). */
  intAttributes?: Record<string, number>;
}

export interface OnnxValue {
  name: string;
  /** ONNX TensorProto.DataType (1 = FLOAT, 2 = UINT8, 7 = INT64, ...). */
  elemType: number;
  /** A string is a symbolic (variable) dim. */
  dims: Array<number | string>;
}

export interface OnnxGraph {
  name: string;
  nodes: OnnxNode[];
  initializers: Array<{ name: string; dims: number[]; data: Float32Array }>;
  inputs: OnnxValue[];
  outputs: OnnxValue[];
  docString: string;
}

const root = protobuf.loadSync(path.join(path.dirname(fileURLToPath(import.meta.url)), 'onnx.proto'));
const ModelProto = root.lookupType('onnx.ModelProto');

function valueInfo(value: OnnxValue) {
  return {
    name: value.name,
    type: {
      tensorType: {
        elemType: value.elemType,
        shape: { dim: value.dims.map((dim) => (typeof dim === 'string' ? { dimParam: dim } : { dimValue: dim })) },
      },
    },
  };
}

export function encodeModel(graph: OnnxGraph): Uint8Array {
  const model = {
    irVersion: IR_VERSION,
    producerName: 'conduit tools/onnx',
    opsetImport: [{ domain: '', version: OPSET_VERSION }],
    graph: {
      name: graph.name,
      docString: graph.docString,
      node: graph.nodes.map((node, i) => ({
        name: `${node.opType.toLowerCase()}_${i}`,
        opType: node.opType,
        input: node.inputs,
        output: node.outputs,
        attribute: Object.entries(node.intAttributes ?? {}).map(([name, value]) => ({ name, i: value, type: 2 })),
      })),
      initializer: graph.initializers.map((init) => ({
        name: init.name,
        dims: init.dims,
        dataType: ONNX_FLOAT,
        rawData: new Uint8Array(init.data.buffer, init.data.byteOffset, init.data.byteLength),
      })),
      input: graph.inputs.map(valueInfo),
      output: graph.outputs.map(valueInfo),
    },
  };
  const error = ModelProto.verify(model);
  if (error !== null) throw new Error(`invalid ONNX model: ${error}`);
  return ModelProto.encode(ModelProto.fromObject(model)).finish();
}

export function writeModel(file: string, graph: OnnxGraph): void {
  writeFileSync(file, encodeModel(graph));
}
