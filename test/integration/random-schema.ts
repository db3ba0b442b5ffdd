// Random JSON schemas of the kind clients send for structured outputs, drawn fresh from a seed:
// objects (required subsets, closed with additionalProperties: false), arrays with item bounds,
// enums and consts, nullable types, anyOf of different types, nesting, string formats and
// patterns, length bounds, integer and number bounds (inclusive and exclusive). Strings stay short (a bound, an enum, a format of
// bounded length) so that a small model at temperature 1 finishes within its token budget.

export type Schema = Record<string, unknown>;

const FORMATS = ['date', 'time', 'date-time', 'ipv4', 'ipv6', 'uuid', 'duration'] as const;
const WORDS = ['red', 'green', 'blue', 'north', 'south', 'alpha', 'beta', 'gamma', 'yes', 'no'];

export class SchemaSampler {
  private state: number;

  constructor(seed: number) {
    this.state = seed >>> 0 || 1;
  }

  private next(): number {
    this.state ^= this.state << 13;
    this.state ^= this.state >>> 17;
    this.state ^= this.state << 5;
    return (this.state >>> 0) / 2 ** 32;
  }

  private int(low: number, high: number): number {
    return low + Math.floor(this.next() * (high - low + 1));
  }

  private pick<T>(items: readonly T[]): T {
    return items[Math.floor(this.next() * items.length)];
  }

  /** An object schema, the root of a structured output; strict: every property required, as OpenAI's strict mode wants. */
  object(depth = 0, strict = false): Schema {
    const numProperties = this.int(1, depth === 0 ? 4 : 3);
    const properties: Record<string, Schema> = {};
    for (let i = 0; i < numProperties; i++) properties[`${this.pick(WORDS)}_${i}`] = this.value(depth + 1, strict);
    const names = Object.keys(properties);
    const required = strict ? names : names.filter(() => this.next() < 0.6);
    return { type: 'object', properties, required, additionalProperties: false };
  }

  private value(depth: number, strict: boolean): Schema {
    const kinds = ['string', 'enum', 'format', 'pattern', 'integer', 'number', 'boolean', 'nullable', 'const', 'anyOf', 'array'];
    if (depth < 3) kinds.push('object', 'object');
    switch (this.pick(kinds)) {
      case 'string': {
        const maxLength = this.int(1, 12);
        return { type: 'string', minLength: this.int(0, Math.min(3, maxLength)), maxLength };
      }
      case 'enum':
        return { type: 'string', enum: Array.from(new Set(Array.from({ length: this.int(2, 4) }, () => this.pick(WORDS)))) };
      case 'format':
        return { type: 'string', format: this.pick(FORMATS) };
      case 'pattern':
        return { type: 'string', pattern: this.pick(['^[a-z]{2,6}$', '^[A-Z][0-9]{3}$', '^(ab|cd){1,4}$', '^[0-9]{2}-[0-9]{2}$']) };
      case 'integer': {
        const minimum = this.int(-50, 50);
        const maximum = minimum + this.int(0, 1000);
        return this.int(0, 1) === 0 ? { type: 'integer', minimum, maximum } : { type: 'integer', exclusiveMinimum: minimum - 1, exclusiveMaximum: maximum + 1 };
      }
      case 'number': {
        // Bounds with a fraction, either kind, or none.
        // Both bounds whole thousandths, divided once: a sum of two fractions can carry binary
        // rounding into 16 digits (4.123000000000001), which the server refuses for exclusive bounds.
        const lowThousandths = this.int(-500, 500) * 10;
        const low = lowThousandths / 1000;
        const high = (lowThousandths + this.int(1, 100_000)) / 1000;
        const bounds = [{}, { minimum: low, maximum: high }, { exclusiveMinimum: low, exclusiveMaximum: high }, { minimum: low }, { exclusiveMaximum: high }];
        return { type: 'number', ...this.pick(bounds) };
      }
      case 'boolean':
        return { type: 'boolean' };
      case 'nullable':
        return { type: [this.pick(['integer', 'boolean']), 'null'] };
      case 'const':
        return { const: this.pick(WORDS) };
      case 'anyOf':
        return { anyOf: [{ type: 'integer', minimum: 0, maximum: 9 }, { type: 'string', maxLength: 4 }] };
      case 'array': {
        const maxItems = this.int(1, 3);
        const items = this.pick<Schema>([{ type: 'integer', minimum: 0, maximum: 99 }, { type: 'string', enum: ['a', 'b', 'c'] }, { type: 'boolean' }]);
        return { type: 'array', items, minItems: this.int(0, maxItems), maxItems };
      }
      default:
        return this.object(depth, strict);
    }
  }
}
