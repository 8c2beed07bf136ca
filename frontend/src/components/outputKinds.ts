import type { OutputKind } from '../api/types';

/** Each output kind in words, with the metric Kiln judges it by (devices/contract.py KIND_METRICS). */
export const KIND_LABELS: Record<OutputKind, { label: string; metric: string }> = {
  class_scores: { label: 'Class scores', metric: 'top-1 agreement (ties excluded), top-5' },
  class_ids: { label: 'Class ids', metric: 'id agreement' },
  probability_map: { label: 'Probability map', metric: 'mask IoU at 0.5, SQNR' },
  dense: { label: 'Dense map', metric: 'relative L2, SQNR' },
  embedding: { label: 'Embedding / hidden states', metric: 'cosine per vector (mean, 5th percentile)' },
  detection: { label: 'Detection head', metric: 'recall and precision vs FP32 (IoU ≥ 0.5), box IoU' },
  regression: { label: 'Regression', metric: 'relative L2, SQNR' },
};

export function kindLabel(kind: string | null | undefined): string {
  if (!kind) return 'decided when a job runs';
  return KIND_LABELS[kind as OutputKind]?.label ?? kind;
}

/** What a declared metric needs besides output and kind. */
export function declaredOptions(kind: string): ('threshold' | 'blank' | 'plugin')[] {
  if (kind === 'mask_iou' || kind === 'mean_iou' || kind === 'detection') return ['threshold'];
  if (kind === 'ctc') return ['blank'];
  if (kind === 'plugin') return ['plugin'];
  return [];
}
