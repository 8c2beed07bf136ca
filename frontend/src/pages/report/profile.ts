/**
 * What the agent's per-operator profile means, in numbers a reader can put next to the p50.
 *
 * The agent (devices/agent/runner.py, devices/backends/*.profile) runs the variant PROFILE_RUNS
 * (10) times in a separate session with per-node timing switched on and sends each node's time
 * summed over those runs divided by the runs: a mean per run that includes the profiler's own cost
 * per node. Agents since `warmup_runs` was added leave one warm-up run out; older ones counted the
 * first, cold run too. The total is therefore often more than the benchmark's p50 (warmed up,
 * profiler off), by many times when the cold run was counted. Each row's `share` of the profiled time does carry
 * over, so share x p50 is the part of the benchmark's p50 the row stands for.
 */
import type { ReportVariant, SensitivityRow } from '../../api/types';

export interface ProfileNode {
  name: string;
  op_type: string;
  time_ms: number;
  share?: number;
  /** The model's own node names this runtime node runs (OpenVINO fuses and renames). */
  layers?: string[];
}

export interface LayerRow {
  /** The model's own node name(s): what the user knows the layer by. */
  name: string;
  /** The runtime's name, when it differs (`Multiply_615451`). */
  runtimeName: string | null;
  opType: string;
  /** The row's part of the benchmark's p50 (share of profiled time x p50), when there is a p50. */
  ofP50Ms: number | null;
  share: number;
  profiledMs: number;
  sqnrDb: number | null;
}

type Profile = { by_op_type?: { op_type: string; time_ms: number; share?: number; count?: number }[]; by_node?: unknown[]; runs?: number; warmup_runs?: number; total_ms?: number };

function profileOf(variant: ReportVariant): Profile {
  return (variant.profile ?? {}) as Profile;
}

export function profiledTotalMs(variant: ReportVariant): number {
  const profile = profileOf(variant);
  if (Number.isFinite(profile.total_ms)) return profile.total_ms as number;
  return (profile.by_op_type ?? []).reduce((sum, row) => sum + (Number.isFinite(row.time_ms) ? row.time_ms : 0), 0);
}

/** A row's share of all profiled time, from the agent's `share` or, failing that, its time over the total. */
function shareOf(row: { time_ms: number; share?: number }, total: number): number {
  if (Number.isFinite(row.share)) return row.share as number;
  return total > 0 && Number.isFinite(row.time_ms) ? row.time_ms / total : 0;
}

function p50Of(variant: ReportVariant): number | null {
  const p50 = variant.latency_ms?.p50;
  return typeof p50 === 'number' && Number.isFinite(p50) && p50 > 0 ? p50 : null;
}

export interface OpTypeBar {
  opType: string;
  count: number;
  share: number;
  profiledMs: number;
  ofP50Ms: number | null;
}

/** Per operator type, slowest first: its share, its part of the p50 and the profiler's raw mean. */
export function opTypeBars(variant: ReportVariant): OpTypeBar[] {
  const total = profiledTotalMs(variant);
  const p50 = p50Of(variant);
  return [...(profileOf(variant).by_op_type ?? [])]
    .filter((row) => Number.isFinite(row.time_ms))
    .sort((a, b) => b.time_ms - a.time_ms)
    .map((row) => {
      const share = shareOf(row, total);
      return { opType: row.op_type, count: row.count ?? 0, share, profiledMs: row.time_ms, ofP50Ms: p50 === null ? null : share * p50 };
    });
}

/** The caption of the per-operator chart: exactly what its numbers are. */
export function profileCaption(variant: ReportVariant, label: string): string {
  const profile = profileOf(variant);
  const runs = Number.isFinite(profile.runs) ? (profile.runs as number) : 10;
  const total = profiledTotalMs(variant);
  const p50 = p50Of(variant);
  const warmup = Number.isFinite(profile.warmup_runs) ? (profile.warmup_runs as number) : 0;
  const cold = warmup > 0 ? `after ${warmup} warm-up run${warmup === 1 ? '' : 's'} left out` : 'first (cold) run included and no warm-up';
  const profiled =
    `The profiler's own times are a mean per run over ${runs} runs of a separate session with per-node timing on, ${cold}: ` +
    `${formatMs(total)} per run in all`;
  if (p50 === null) return `Time per operator type for ${label}, slowest first. ${profiled}; there is no benchmark p50 to scale them to.`;
  const ratio = total / p50;
  return (
    `Time per operator type for ${label}, slowest first. Each bar is the type's share of the profiled time applied to the benchmark's p50 ` +
    `(${formatMs(p50)}), so the bars add up to the p50. ${profiled}` +
    (ratio > 1.05 ? `, ${ratio.toFixed(1)}x the p50, because of ${warmup > 0 ? '' : 'the cold run and '}the profiler's overhead per node.` : '.') +
    ' Hover a bar for its profiled time.'
  );
}

function formatMs(value: number): string {
  return `${value.toLocaleString('en-US', { maximumFractionDigits: value < 0.1 ? 4 : 3 })} ms`;
}

function isNode(value: unknown): value is ProfileNode {
  const row = value as ProfileNode;
  return typeof row === 'object' && row !== null && typeof row.name === 'string' && Number.isFinite(row.time_ms);
}

/** A runtime's name for a graph node: ONNX Runtime renames nodes it rewrites (`relu1_nchwc`, `…_token_3`). */
export function graphNodeName(runtimeName: string): string {
  return runtimeName.replace(/(_nchwc|_token_\d+|_output_\d+)+$/, '');
}

/** The slowest layers of a variant, each with how much INT8 hurts it (the search's sensitivity) where measured. */
export function layerRows(variant: ReportVariant, sensitivity: SensitivityRow[], limit = 15): LayerRow[] {
  const nodes = (profileOf(variant).by_node ?? []).filter(isNode).sort((a, b) => b.time_ms - a.time_ms).slice(0, limit);
  const total = profiledTotalMs(variant);
  const p50 = p50Of(variant);
  const sqnr = new Map(sensitivity.filter((row) => Number.isFinite(row.sqnr_db)).map((row) => [row.node, row.sqnr_db]));
  return nodes.map((node) => {
    const share = shareOf(node, total);
    const layers = (node.layers ?? []).filter((layer) => typeof layer === 'string' && layer);
    const modelNames = layers.length ? layers : [graphNodeName(node.name)];
    // The worst (lowest) SQNR of the model's nodes this runtime node runs: INT8 hurts the layer that much.
    const measured = [node.name, ...modelNames].map((name) => sqnr.get(name)).filter((value): value is number => value !== undefined);
    const name = modelNames.join(' + ');
    return {
      name,
      runtimeName: name === node.name ? null : node.name,
      opType: node.op_type,
      share,
      profiledMs: node.time_ms,
      ofP50Ms: p50 === null ? null : share * p50,
      sqnrDb: measured.length ? Math.min(...measured) : null,
    };
  });
}
