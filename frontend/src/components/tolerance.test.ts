import { describe, expect, it } from 'vitest';
import { autoFigures } from './outputKinds';
import { dropMeaning, toleranceText } from './tolerance';

describe('a tolerance in words', () => {
  it('names what auto reads for the job, in points: never "auto may drop by 1%"', () => {
    expect(toleranceText({ metric: 'auto', max_drop: 0.01 }, ['top1_agreement'])).toBe('top-1 agreement may drop by at most 1 point');
    expect(toleranceText({ metric: 'auto', max_drop: 0.005 }, ['top1_accuracy', 'mask_iou'])).toBe('top-1 accuracy and mask IoU may drop by at most 0.5 points');
    expect(toleranceText({ metric: 'auto', max_drop: 0.01 }, null)).toBe("each primary output's metric may drop by at most 1 point");
    expect(toleranceText({ metric: 'auto', max_drop: 0.01 }, ['relative_l2'])).toBe('relative L2 error may rise by at most 0.01');
    expect(toleranceText({ metric: 'top1_agreement', max_drop: 0.02 })).toBe('top-1 agreement may drop by at most 2 points');
  });

  it('says what the percentage typed lets a variant lose, on the metric its own scale', () => {
    expect(dropMeaning(1, 'auto', ['top1_agreement'])).toBe('1% = 1 point of top-1 agreement: with FP32 at 100%, a variant at 99% still passes.');
    expect(dropMeaning(0.5, 'cosine')).toBe("0.5% = 0.005 of cosine similarity: FP32's 1.000 → 0.995 still passes.");
    expect(dropMeaning(1, 'relative_l2')).toBe("1% = relative L2 error up to 0.01 above FP32's (which is 0) still passes.");
    expect(dropMeaning(1, 'auto', null)).toMatch(/^1% = 1 point of each primary output's metric on their 0–100% scale/);
  });
});

describe('what auto judges', () => {
  const logits = { name: 'logits', kind: 'class_scores', primary: true };
  it("reads each primary output by its kind, and task accuracy when there are labels that fit", () => {
    expect(autoFigures([logits], false)).toEqual(['top1_agreement']);
    expect(autoFigures([logits], true)).toEqual(['top1_accuracy']);
    expect(autoFigures([{ name: 'mask', kind: 'probability_map', primary: true }, { name: 'aux', kind: 'dense', primary: false }], true)).toEqual(['mean_iou']);
    expect(autoFigures([{ ...logits, declared: [{ kind: 'top5_accuracy', primary: true }] }], true)).toEqual(['top5_accuracy']);
    expect(autoFigures([{ ...logits, kind: null }], true)).toBeNull();
  });
});
