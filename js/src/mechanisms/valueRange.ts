/**
 * Ranges of report values: what an honest randomizer of a round can send, value by value
 * (mirrors `ValueRange` and `check_report_values` of `client/mechanisms.py`).
 *
 * @module
 */

import { ValueOutOfRange } from "../wire/errors.js";

/** The integers `low, low + stride, ..., high` (`stride >= 1`). */
export interface ValueRange {
  readonly low: bigint;
  readonly high: bigint;
  readonly stride: bigint;
}

/** The range `low, low + stride, ..., high`. */
export function valueRange(low: bigint, high: bigint, stride: bigint = 1n): ValueRange {
  return { low, high, stride };
}

/** Whether `value` lies in `range`: between its ends and on its stride. */
export function inRange(value: bigint, range: ValueRange): boolean {
  if (value < range.low || value > range.high) return false;
  return (value - range.low) % range.stride === 0n;
}

/** Throw {@link ValueOutOfRange} unless there is one value per range and every value lies in its range. */
export function checkReportValues(values: readonly bigint[], ranges: readonly ValueRange[]): void {
  if (values.length !== ranges.length) {
    throw new ValueOutOfRange(`expected ${ranges.length} values, got ${values.length}`);
  }
  for (let i = 0; i < values.length; i++) {
    const value = values[i];
    const allowed = ranges[i];
    if (typeof value !== "bigint" || !inRange(value, allowed)) {
      throw new ValueOutOfRange(`value ${i} outside [${allowed.low}, ${allowed.high}] (stride ${allowed.stride})`);
    }
  }
}
