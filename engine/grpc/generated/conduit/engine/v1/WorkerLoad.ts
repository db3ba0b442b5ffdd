// Original file: proto/engine.proto


export interface WorkerLoad {
  'numRunning'?: (number);
  'numWaiting'?: (number);
  'numFreeBlocks'?: (number);
  'numTotalBlocks'?: (number);
  'numQueuedPrefillTokens'?: (number);
  'numCachedBlocks'?: (number);
}

export interface WorkerLoad__Output {
  'numRunning': (number);
  'numWaiting': (number);
  'numFreeBlocks': (number);
  'numTotalBlocks': (number);
  'numQueuedPrefillTokens': (number);
  'numCachedBlocks': (number);
}
