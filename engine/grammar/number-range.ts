// JSON numbers held to `minimum` / `maximum` / `exclusiveMinimum` / `exclusiveMaximum` as a
// grammar of their digits. xgrammar's own ranges are wrong (0.1.27: 10.62 under maximum 10, any
// byte in place of the point of 1.5, no upper bound at all for exclusive integer bounds), so
// json-schema.ts replaces a bounded number with a marker (a const string carrying the range) and
// the grammar thread puts this grammar in the marker's place in xgrammar's EBNF of the schema.
//
// A value is a scaled integer n / 10^F (F fraction digits at most: 0 for integers, at least 6
// for numbers, more when a bound has more), so every bound becomes an exact integer bound. The
// text is plain decimal, never an exponent: an optional minus, the integer part without leading
// zeros, and optionally a point and 1 to F digits (trailing zeros allowed: 2.50 is 2.5).

/** What a marker carries: the scaled bounds (null: unbounded) and the fraction digits. */
export interface ScaledRange {
  low: bigint | null;
  high: bigint | null;
  fractionDigits: number;
}

export interface NumericBounds {
  minimum?: number;
  maximum?: number;
  exclusiveMinimum?: number;
  exclusiveMaximum?: number;
}

/** The fewest fraction digits a number value's grammar keeps (xgrammar's own number keeps 6). */
const MIN_FRACTION_DIGITS = 6;
/** Bounds finer than this are refused. */
const MAX_FRACTION_DIGITS = 20;
const MARKER_PREFIX = 'conduit-number-range:';

/** A finite number as a plain decimal (no exponent): its shortest round-trip digits. */
function plainDecimal(value: number): { digits: string; exponent: number; negative: boolean } {
  const [mantissa, exponentText] = Math.abs(value).toExponential().split('e');
  const [whole, fraction = ''] = mantissa.split('.');
  // value = 0.(whole fraction) × 10^(exponent + 1), read as digits × 10^(exponent - fraction.length)
  return { digits: whole + fraction, exponent: Number(exponentText) - fraction.length, negative: value < 0 };
}

function fractionDigitsOf(value: number): number {
  return Math.max(0, -plainDecimal(value).exponent);
}

/** floor or ceil of value × 10^scale, exactly. */
function scaled(value: number, scale: number, round: 'floor' | 'ceil'): bigint {
  const { digits, exponent, negative } = plainDecimal(value);
  const shift = exponent + scale;
  const magnitude = BigInt(digits);
  if (shift >= 0) return (negative ? -1n : 1n) * magnitude * 10n ** BigInt(shift);
  const divisor = 10n ** BigInt(-shift);
  const quotient = magnitude / divisor;
  const exact = quotient * divisor === magnitude;
  if (!negative) return exact || round === 'floor' ? quotient : quotient + 1n;
  return exact || round === 'ceil' ? -quotient : -quotient - 1n;
}

/**
 * The scaled range of a bounded number or integer, or why it cannot be honoured exactly: a bound
 * finer than 10^-20, an exclusive bound so large that a value one digit past it may parse to the
 * bound itself, or no value at all.
 */
export function scaledRange(bounds: NumericBounds, integer: boolean): ScaledRange | string {
  const present = Object.values(bounds).filter((bound): bound is number => bound !== undefined);
  const fractionDigits = integer ? 0 : Math.max(MIN_FRACTION_DIGITS, ...present.map(fractionDigitsOf));
  if (fractionDigits > MAX_FRACTION_DIGITS) return `bounds finer than 1e-${MAX_FRACTION_DIGITS} are not supported`;
  // Past this, two values 10^-F apart may parse to the same double.
  const exactBelow = 2 ** 53 / 10 ** fractionDigits;
  for (const [name, bound] of Object.entries(bounds)) {
    if (bound !== undefined && name.startsWith('exclusive') && Math.abs(bound) >= exactBelow) {
      return `"${name}" beyond ${exactBelow.toPrecision(3)} is not supported${integer ? '' : ' on numbers'}`;
    }
  }
  const lows: bigint[] = [];
  const highs: bigint[] = [];
  if (bounds.minimum !== undefined) lows.push(scaled(bounds.minimum, fractionDigits, 'ceil'));
  if (bounds.exclusiveMinimum !== undefined) lows.push(scaled(bounds.exclusiveMinimum, fractionDigits, 'floor') + 1n);
  if (bounds.maximum !== undefined) highs.push(scaled(bounds.maximum, fractionDigits, 'floor'));
  if (bounds.exclusiveMaximum !== undefined) highs.push(scaled(bounds.exclusiveMaximum, fractionDigits, 'ceil') - 1n);
  const low = lows.length === 0 ? null : lows.reduce((a, b) => (a > b ? a : b));
  const high = highs.length === 0 ? null : highs.reduce((a, b) => (a < b ? a : b));
  if (low !== null && high !== null && low > high) return `no ${integer ? 'integer' : 'number'} lies within the bounds`;
  return { low, high, fractionDigits };
}

/** The const string that stands for the range in the schema xgrammar sees. */
export function rangeMarker(range: ScaledRange): string {
  return `${MARKER_PREFIX}${range.low ?? ''}:${range.high ?? ''}:${range.fractionDigits}`;
}

/** Whether a schema's text has bounded numbers (it then compiles through its EBNF). */
export function hasRangeMarkers(schemaText: string): boolean {
  return schemaText.includes(MARKER_PREFIX);
}

/** How xgrammar's EBNF of a schema spells a marker (a JSON string literal). */
const MARKER_IN_EBNF = /"\\"conduit-number-range:(-?\d*):(-?\d*):(\d+)\\""/g;

/** xgrammar's EBNF of a schema with each marker replaced by its range's grammar. */
export function replaceRangeMarkers(ebnf: string): string {
  return ebnf.replace(MARKER_IN_EBNF, (_, low: string, high: string, fractionDigits: string) =>
    rangeGrammar({ low: low === '' ? null : BigInt(low), high: high === '' ? null : BigInt(high), fractionDigits: Number(fractionDigits) }),
  );
}

function alternatives(options: string[]): string {
  return options.length === 1 ? options[0] : `(${options.join(' | ')})`;
}

/** The EBNF expression of every text whose value is in the range. */
export function rangeGrammar(range: ScaledRange): string {
  const { low, high, fractionDigits } = range;
  const options: string[] = [];
  // Negative values: a minus and the magnitudes from max(1, -high) up to -low.
  if (low === null || low < 0n) {
    const magnitudes = nonNegativeGrammar(high === null || high >= 0n ? 1n : -high, low === null ? null : -low, fractionDigits);
    if (magnitudes !== null) options.push(`"-" ${magnitudes}`);
  }
  if (high === null || high >= 0n) {
    const values = nonNegativeGrammar(low === null || low < 0n ? 0n : low, high, fractionDigits);
    if (values !== null) options.push(values);
  }
  return alternatives(options);
}

/** Texts (no sign) of the scaled values from low (>= 0) to high (null: no end); null when none. */
function nonNegativeGrammar(low: bigint, high: bigint | null, fractionDigits: number): string | null {
  if (high !== null && low > high) return null;
  const scale = 10n ** BigInt(fractionDigits);
  // Digits of the integer part (0 is one digit).
  const widthOf = (value: bigint) => Math.max(1, value.toString().length - fractionDigits);
  const lowWidth = widthOf(low);
  const highWidth = high === null ? lowWidth : widthOf(high);
  const options: string[] = [];
  for (let width = lowWidth; width <= highWidth; width++) {
    const first = width === 1 ? 0n : 10n ** BigInt(width - 1) * scale;
    const last = 10n ** BigInt(width) * scale - 1n;
    const from = low > first ? low : first;
    const to = high !== null && high < last ? high : last;
    if (from > to) continue;
    const length = width + fractionDigits;
    options.push(new FixedWidth(width, length).range(0, from.toString().padStart(length, '0'), to.toString().padStart(length, '0')));
  }
  if (high === null) {
    // Every value with a longer integer part.
    const fraction = fractionDigits > 0 ? ` ("." [0-9]{1,${fractionDigits}})?` : '';
    options.push(`[1-9] [0-9]{${highWidth}} [0-9]*${fraction}`);
  }
  return alternatives(options);
}

/**
 * Texts of the scaled values between two digit strings of one length, the integer part being the
 * first `width` digits: the digits are read left to right, and at the point (after the integer
 * part) and after each fraction digit the text may end if the digits left may all be zeros.
 */
class FixedWidth {
  private readonly anyFrom = new Map<number, string>();

  constructor(
    private readonly width: number,
    private readonly length: number,
  ) {}

  /** From position `at`, the rest of the texts whose remaining digits lie in [low, high]. */
  range(at: number, low: string, high: string): string {
    if (at === this.length) return '""';
    const isFull = /^0*$/.test(low) && /^9*$/.test(high);
    if (isFull && this.anyFrom.has(at)) return this.anyFrom.get(at)!;
    const options: string[] = [];
    const mayEnd = at >= this.width && /^0*$/.test(low);
    if (mayEnd) options.push('""');
    const digits = this.digits(at, low, high);
    options.push(at === this.width ? `"." ${digits}` : digits);
    const grammar = alternatives(options);
    if (isFull) this.anyFrom.set(at, grammar);
    return grammar;
  }

  private digits(at: number, low: string, high: string): string {
    const lowDigit = Number(low[0]);
    const highDigit = Number(high[0]);
    const lowRest = low.slice(1);
    const highRest = high.slice(1);
    const zeros = '0'.repeat(lowRest.length);
    const nines = '9'.repeat(lowRest.length);
    const digit = (from: number, to: number) => (from === to ? `"${from}"` : `[${from}-${to}]`);
    const then = (head: string, rest: string) => (rest === '""' ? head : `${head} ${rest}`);
    if (lowDigit === highDigit) return then(digit(lowDigit, lowDigit), this.range(at + 1, lowRest, highRest));
    const options: string[] = [];
    // Whole digits between the ends, and the ends themselves when their rest is whole too.
    const from = lowRest === zeros ? lowDigit : lowDigit + 1;
    const to = highRest === nines ? highDigit : highDigit - 1;
    if (from > lowDigit) options.push(then(digit(lowDigit, lowDigit), this.range(at + 1, lowRest, nines)));
    if (from <= to) options.push(then(digit(from, to), this.range(at + 1, zeros, nines)));
    if (to < highDigit) options.push(then(digit(highDigit, highDigit), this.range(at + 1, zeros, highRest)));
    return alternatives(options);
  }
}
