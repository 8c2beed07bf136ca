/** Pure summaries of performance-database rows for the Performance page's charts. */
import type { Measurement } from '../api/types';

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
}

/** The rule "which device should I buy?" answers by, in the words the page shows. */
export const BUYING_RULE = "the fastest variant within its job's accuracy tolerance";

export interface DevicePick {
  label: string;
  p50: number;
  variant: string;
  /** Whether its job's decision recommended this variant on the device. */
  recommended: boolean;
  /** Faster variants on this device and runtime that missed their job's tolerance, left out of the answer. */
  fasterOutside: number;
}

function withinTolerance(row: Measurement): boolean {
  return 'within_tolerance' in row.accuracy && row.accuracy.within_tolerance === true;
}

/**
 * "Which device should I buy?": per device and runtime, the fastest variant within its job's accuracy tolerance (a
 * faster one that breaks the model is no answer), with how many faster ones were left out for missing it. A device
 * with nothing within tolerance is not ranked.
 */
export function fastestPerDevice(rows: Measurement[]): DevicePick[] {
  const groups = new Map<string, Measurement[]>();
  for (const row of rows) {
    const label = `${row.agent.name} · ${row.backend}`;
    groups.set(label, [...(groups.get(label) ?? []), row]);
  }
  const picks: DevicePick[] = [];
  for (const [label, group] of groups) {
    const passing = group.filter(withinTolerance);
    if (passing.length === 0) continue;
    const best = passing.reduce((fastest, row) => (row.p50_ms < fastest.p50_ms || (row.p50_ms === fastest.p50_ms && row.recommended) ? row : fastest));
    picks.push({
      label,
      p50: best.p50_ms,
      variant: best.label || best.variant_key,
      recommended: !!best.recommended,
      fasterOutside: group.filter((row) => !withinTolerance(row) && row.p50_ms < best.p50_ms).length,
    });
  }
  return picks.sort((a, b) => a.p50 - b.p50);
}

/** The devices whose measurements have no variant within tolerance (named beside the answer, not ranked). */
export function devicesWithoutAPass(rows: Measurement[]): string[] {
  const ranked = new Set(fastestPerDevice(rows).map((pick) => pick.label));
  return [...new Set(rows.map((row) => `${row.agent.name} · ${row.backend}`))].filter((label) => !ranked.has(label)).sort();
}

function modelKey(row: Measurement): string {
  // A model by its weights' digest: byte-identical uploads under two names are one model, and a deleted model's rows keep it.
  return row.model_sha256 || `id:${row.model.id}`;
}

/**
 * The model a "which device should I buy?" answer is about when none is chosen: the one measured on the most
 * devices, then the most recently measured. Fastest-of-anything across models would crown a toy test model.
 */
export function buyingModel(rows: Measurement[]): { key: string; name: string; rows: Measurement[] } | null {
  const byModel = new Map<string, Measurement[]>();
  for (const row of rows) byModel.set(modelKey(row), [...(byModel.get(modelKey(row)) ?? []), row]);
  const ranked = [...byModel.entries()].map(([key, group]) => ({
    key,
    name: group[0].model.name,
    rows: group,
    devices: new Set(group.map((row) => row.device_key)).size,
    latest: group.reduce((latest, row) => (row.measured_at > latest ? row.measured_at : latest), ''),
  }));
  ranked.sort((a, b) => b.devices - a.devices || b.latest.localeCompare(a.latest));
  return ranked[0] ?? null;
}

/** The jobs that measured the same model as `job` (a comparison across models reads as nonsense ratios), newest first. */
export function jobsLike(rows: Measurement[], job: number): number[] {
  const model = rows.find((row) => row.job === job);
  if (!model) return [];
  return jobsIn(rows.filter((row) => modelKey(row) === modelKey(model)));
}

/** One device across toolchain versions: median p50 per backend version (same filters, so the same models and variants). */
export function p50ByToolchain(rows: Measurement[]): { label: string; p50: number; count: number }[] {
  const groups = new Map<string, number[]>();
  for (const row of rows) {
    const label = `${row.agent.name} · ${row.backend} ${row.backend_version || '?'}`;
    groups.set(label, [...(groups.get(label) ?? []), row.p50_ms]);
  }
  return [...groups.entries()].map(([label, values]) => ({ label, p50: median(values), count: values.length })).sort((a, b) => a.label.localeCompare(b.label));
}

export interface JobComparisonRow {
  key: string;
  variant: string;
  backend: string;
  device: string;
  before: number | null;
  after: number | null;
  ratio: number | null;
}

/** A job against an earlier one of the same model: p50 per variant, backend and device, side by side. */
export function compareJobs(rows: Measurement[], job: number, earlier: number): JobComparisonRow[] {
  const cells = new Map<string, JobComparisonRow>();
  for (const row of rows) {
    if (row.job !== job && row.job !== earlier) continue;
    const key = `${row.variant_key}|${row.backend}|${row.device_key}`;
    const cell = cells.get(key) ?? { key, variant: row.variant_key, backend: row.backend, device: row.agent.name, before: null, after: null, ratio: null };
    if (row.job === job) cell.after = row.p50_ms;
    else cell.before = row.p50_ms;
    cells.set(key, cell);
  }
  return [...cells.values()]
    .map((cell) => ({ ...cell, ratio: cell.before && cell.after ? cell.after / cell.before : null }))
    .sort((a, b) => a.key.localeCompare(b.key));
}

/** Jobs present in the rows, newest first. */
export function jobsIn(rows: Measurement[]): number[] {
  return [...new Set(rows.map((row) => row.job).filter((job): job is number => job !== null))].sort((a, b) => b - a);
}
