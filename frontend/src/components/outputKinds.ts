import type { OutputKind } from '../api/types';

/** Each output kind in words, with the metric Kiln judges it by (kiln_contract/contract.py KIND_METRICS). */
export const KIND_LABELS: Record<OutputKind, { label: string; metric: string }> = {
  class_scores: { label: 'Class scores', metric: 'top-1 agreement (ties excluded), top-5' },
  class_ids: { label: 'Class ids', metric: 'id agreement' },
  probability_map: { label: 'Probability map', metric: 'mask IoU at 0.5, SQNR' },
  heat_map: { label: 'Heat map (regions)', metric: 'region F1 against FP32’s regions, peak agreement, mask IoU' },
  distribution: { label: 'Distribution over bins', metric: 'decoded-value agreement, peak agreement, error in bins' },
  dense: { label: 'Dense map', metric: 'relative L2, SQNR' },
  embedding: { label: 'Embedding / hidden states', metric: 'cosine per vector (mean, 5th percentile)' },
  detection: { label: 'Detection head', metric: 'recall and precision vs FP32 (IoU ≥ 0.5), box IoU' },
  regression: { label: 'Regression', metric: 'relative L2, SQNR' },
};

/** Every output kind, in the order the picker lists them. */
export const OUTPUT_KINDS = Object.keys(KIND_LABELS) as OutputKind[];

export function kindLabel(kind: string | null | undefined): string {
  if (!kind) return 'decided when a job runs';
  return KIND_LABELS[kind as OutputKind]?.label ?? kind;
}

/** What a declared metric needs besides output and kind. */
export function declaredOptions(kind: string): ('threshold' | 'blank' | 'plugin')[] {
  if (kind === 'mask_iou' || kind === 'mean_iou' || kind === 'regions' || kind === 'detection') return ['threshold'];
  if (kind === 'ctc') return ['blank'];
  if (kind === 'plugin') return ['plugin'];
  return [];
}

/** The figure `auto` judges an output of each kind by (kiln_contract/contract.py KIND_METRICS), and the label metric that
 * replaces it when the validation set has labels that fit (kiln_contract/metrics.py `_label_metric`). */
const AUTO_FIGURES: Record<OutputKind, { figure: string; labelled?: string }> = {
  class_scores: { figure: 'top1_agreement', labelled: 'top1_accuracy' },
  class_ids: { figure: 'id_agreement' },
  probability_map: { figure: 'mask_iou', labelled: 'mean_iou' },
  heat_map: { figure: 'region_f1' },
  distribution: { figure: 'decoded_agreement' },
  dense: { figure: 'relative_l2' },
  embedding: { figure: 'cosine_p5' },
  detection: { figure: 'detection_f1' },
  regression: { figure: 'relative_l2' },
};

/** The figure a declared metric's tolerance reads (kiln_contract/contract.py DECLARABLE). */
const DECLARED_FIGURES: Record<string, string> = {
  top1_agreement: 'top1_agreement', top5_agreement: 'top5_agreement', id_agreement: 'id_agreement', mask_iou: 'mask_iou',
  relative_l2: 'relative_l2', sqnr: 'sqnr_db', cosine: 'cosine_p5', sentence_cosine: 'sentence_cosine_p5', detection: 'detection_f1',
  neighbours: 'neighbour_agreement', regions: 'region_f1', peak: 'peak_agreement', decoded: 'decoded_agreement',
  accuracy: 'top1_accuracy', top5_accuracy: 'top5_accuracy', mean_iou: 'mean_iou', ctc: 'sequence_accuracy', plugin: 'plugin',
};

export interface JudgedOutput {
  name: string;
  kind: string | null | undefined;
  primary: boolean;
  declared?: { kind: string; primary?: boolean }[];
}

/**
 * The figures a tolerance of `auto` reads for these outputs: each primary output's declared metric, else its kind's
 * (the first primary a label metric fits takes it when there are labels). Null while a primary output's kind is unknown
 * (Kiln infers it when the job runs).
 */
export function autoFigures(outputs: JudgedOutput[], labelled: boolean): string[] | null {
  const figures: string[] = [];
  let labelsUsed = !labelled;
  for (const output of outputs.filter((candidate) => candidate.primary)) {
    const declared = output.declared?.find((entry) => entry.primary) ?? output.declared?.[0];
    if (declared) {
      figures.push(DECLARED_FIGURES[declared.kind] ?? declared.kind);
      continue;
    }
    const auto = output.kind ? AUTO_FIGURES[output.kind as OutputKind] : undefined;
    if (!auto) return null;
    if (!labelsUsed && auto.labelled) {
      figures.push(auto.labelled);
      labelsUsed = true;
    } else {
      figures.push(auto.figure);
    }
  }
  return figures.length ? figures : null;
}
