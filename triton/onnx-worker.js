// One ONNX Runtime session on its own thread: onnxruntime-node's session.run blocks the thread
// that calls it, so each model instance runs here and the gateway's event loop stays free.
// Plain JavaScript, so the worker needs no TypeScript loader.
import { parentPort, workerData } from 'node:worker_threads';
import ort from 'onnxruntime-node';

const session = await ort.InferenceSession.create(workerData.file, {
  intraOpNumThreads: workerData.numThreads,
  interOpNumThreads: 1,
  executionMode: 'sequential',
});
parentPort.postMessage({ type: 'ready', inputNames: session.inputNames, outputNames: session.outputNames });

parentPort.on('message', async (message) => {
  if (message.type === 'close') {
    await session.release();
    parentPort.close();
    return;
  }
  try {
    const feeds = {};
    for (const { name, type, data, dims } of message.feeds) feeds[name] = new ort.Tensor(type, data, dims);
    const results = await session.run(feeds, message.outputNames);
    const outputs = [];
    const transfer = [];
    for (const name of message.outputNames) {
      const tensor = results[name];
      outputs.push({ name, type: tensor.type, data: tensor.data, dims: Array.from(tensor.dims) });
      if (tensor.type !== 'string') transfer.push(tensor.data.buffer);
    }
    parentPort.postMessage({ type: 'result', id: message.id, outputs }, transfer);
  } catch (err) {
    parentPort.postMessage({ type: 'error', id: message.id, message: err instanceof Error ? err.message : String(err) });
  }
});
