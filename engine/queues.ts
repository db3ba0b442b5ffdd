// The scheduler's queues, every operation O(1) (a linked list threaded through the sequences)
// or O(log n) (a binary heap), so that finishing, aborting or preempting one of thousands of
// requests never shifts an array.

/** What a sequence carries to sit in these queues. */
export interface Queued {
  /** Lower runs first (vLLM's priority policy); 0 by default. */
  readonly priority: number;
  /** Admission order among all requests: the tie-break, and first-come-first-served itself. */
  readonly arrivalIndex: number;
  prev: Queued | null;
  next: Queued | null;
  heapIndex: number;
}

/** A doubly linked list through Queued.prev/next; an item is in at most one list at a time. */
export class SequenceList<T extends Queued> {
  private headItem: T | null = null;
  private tailItem: T | null = null;
  private count = 0;

  get size(): number {
    return this.count;
  }

  get first(): T | null {
    return this.headItem;
  }

  get last(): T | null {
    return this.tailItem;
  }

  /** The item after this one in the list. */
  after(item: T): T | null {
    return item.next as T | null;
  }

  pushBack(item: T): void {
    item.prev = this.tailItem;
    item.next = null;
    if (this.tailItem === null) this.headItem = item;
    else this.tailItem.next = item;
    this.tailItem = item;
    this.count++;
  }

  pushFront(item: T): void {
    item.next = this.headItem;
    item.prev = null;
    if (this.headItem === null) this.tailItem = item;
    else this.headItem.prev = item;
    this.headItem = item;
    this.count++;
  }

  remove(item: T): void {
    if (item.prev === null) this.headItem = item.next as T | null;
    else item.prev.next = item.next;
    if (item.next === null) this.tailItem = item.prev as T | null;
    else item.next.prev = item.prev;
    item.prev = item.next = null;
    this.count--;
  }
}

/** Where requests wait for admission: the next to admit at the front. */
export interface WaitingQueue<T extends Queued> {
  readonly size: number;
  peek(): T | null;
  /** A new request. */
  push(item: T): void;
  /** A preempted request, to be readmitted before the requests that arrived after it. */
  pushPreempted(item: T): void;
  remove(item: T): void;
}

/** First come, first served; a preempted request goes back to the front. */
export class FcfsQueue<T extends Queued> implements WaitingQueue<T> {
  private readonly list = new SequenceList<T>();

  get size(): number {
    return this.list.size;
  }

  peek(): T | null {
    return this.list.first;
  }

  push(item: T): void {
    this.list.pushBack(item);
  }

  pushPreempted(item: T): void {
    this.list.pushFront(item);
  }

  remove(item: T): void {
    this.list.remove(item);
  }
}

function before(a: Queued, b: Queued): boolean {
  return a.priority < b.priority || (a.priority === b.priority && a.arrivalIndex < b.arrivalIndex);
}

/** Lowest priority value first, ties by arrival; a preempted request keeps its place by both. */
export class PriorityQueue<T extends Queued> implements WaitingQueue<T> {
  private readonly heap: T[] = [];

  get size(): number {
    return this.heap.length;
  }

  peek(): T | null {
    return this.heap[0] ?? null;
  }

  push(item: T): void {
    item.heapIndex = this.heap.length;
    this.heap.push(item);
    this.siftUp(item.heapIndex);
  }

  pushPreempted(item: T): void {
    this.push(item);
  }

  remove(item: T): void {
    const index = item.heapIndex;
    const last = this.heap.pop()!;
    item.heapIndex = -1;
    if (last === item) return;
    this.heap[index] = last;
    last.heapIndex = index;
    this.siftDown(this.siftUp(index));
  }

  private siftUp(index: number): number {
    const item = this.heap[index];
    while (index > 0) {
      const parentIndex = (index - 1) >> 1;
      const parent = this.heap[parentIndex];
      if (!before(item, parent)) break;
      this.heap[index] = parent;
      parent.heapIndex = index;
      index = parentIndex;
    }
    this.heap[index] = item;
    item.heapIndex = index;
    return index;
  }

  private siftDown(index: number): void {
    const item = this.heap[index];
    for (;;) {
      let child = 2 * index + 1;
      if (child >= this.heap.length) break;
      if (child + 1 < this.heap.length && before(this.heap[child + 1], this.heap[child])) child++;
      if (!before(this.heap[child], item)) break;
      this.heap[index] = this.heap[child];
      this.heap[index].heapIndex = index;
      index = child;
    }
    this.heap[index] = item;
    item.heapIndex = index;
  }
}
