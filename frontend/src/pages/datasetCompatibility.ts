/** Whether a dataset can feed a model version: every input present, with the model's per-sample shape. */
import type { Dataset, ModelVersion, Shape, TensorSpec } from '../api/types';
import { formatShape } from '../format';

export interface Compatibility {
  fits: boolean;
  /** Why it does not fit, one line per problem, in the user's terms. */
  problems: string[];
}

const FLOAT_TYPES = ['float16', 'float32', 'float64', 'bfloat16'];

function dtypeFamily(dtype: string): string {
  const name = dtype.toLowerCase().replace(/^tensor\(|\)$/g, '');
  if (FLOAT_TYPES.some((kind) => name.includes(kind)) || name === 'float' || name === 'double') return 'float';
  if (name.includes('int') || name === 'bool') return 'integer';
  return name;
}

/** The first mismatch between an array (samples first) and a model input (batch first), or null. */
export function shapeProblem(input: TensorSpec, arrayShape: Shape): string | null {
  const perSample = arrayShape.slice(1);
  const expected = input.shape.slice(1);
  if (perSample.length !== expected.length) {
    return `“${input.name}” is ${formatShape(['N', ...perSample])} here, the model takes ${formatShape(input.shape)} (${expected.length + 1} dimensions, not ${perSample.length + 1})`;
  }
  for (const [axis, dim] of expected.entries()) {
    const actual = perSample[axis];
    if (typeof dim === 'number' && dim > 0 && typeof actual === 'number' && actual !== dim) {
      return `“${input.name}” is ${formatShape(['N', ...perSample])} here, the model takes ${formatShape(input.shape)} (axis ${axis + 1}: ${actual}, not ${dim})`;
    }
  }
  return null;
}

export function datasetCompatibility(dataset: Dataset, version: ModelVersion | null | undefined): Compatibility {
  const problems: string[] = [];
  if (!Number.isFinite(dataset.samples) || dataset.samples < 1) problems.push('it holds no samples that could be read');
  const inputs = version?.signature?.inputs ?? [];
  const arrays = dataset.arrays ?? {};
  for (const input of inputs) {
    const array = arrays[input.name];
    if (!array) {
      problems.push(`no array named “${input.name}” (it has ${Object.keys(arrays).filter((name) => name !== 'labels').map((name) => `“${name}”`).join(', ') || 'none'})`);
      continue;
    }
    const shape = shapeProblem(input, array.shape);
    if (shape) problems.push(shape);
    if (input.dtype && array.dtype && dtypeFamily(input.dtype) !== dtypeFamily(array.dtype)) {
      problems.push(`“${input.name}” is ${array.dtype} here, the model takes ${input.dtype}`);
    }
  }
  return { fits: problems.length === 0, problems };
}

/** Datasets of one kind split into those that fit the model and those that do not, each with its verdict. */
export function splitByCompatibility(datasets: Dataset[], version: ModelVersion | null | undefined) {
  const judged = datasets.map((dataset) => ({ dataset, compatibility: datasetCompatibility(dataset, version) }));
  return { fitting: judged.filter((item) => item.compatibility.fits), misfits: judged.filter((item) => !item.compatibility.fits) };
}

/** The message shown next to the field when a dataset that does not fit is chosen. */
export function mismatchMessage(dataset: Dataset, compatibility: Compatibility): string | null {
  if (compatibility.fits) return null;
  return `“${dataset.name}” does not fit this model: ${compatibility.problems.join('; ')}.`;
}
