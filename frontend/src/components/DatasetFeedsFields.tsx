/** The dataset part of a deployment that says how data is fed: state carried between calls of a
 * sequence (output → input, with a first value) and which calibration samples to use. */
import { useId } from 'react';
import type { JobCreate, ModelVersion } from '../api/types';
import { NameOptions } from './FormFields';

export interface StateRow {
  output: string;
  input: string;
  initial: string;
}

export interface FeedsForm {
  state: StateRow[];
  subsetCount: string;
  subsetSeed: string;
  stratify: boolean;
}

export const emptyFeedsForm: FeedsForm = { state: [], subsetCount: '', subsetSeed: '0', stratify: true };

/** What the form adds to a job request; problems are listed in words (empty when it is fine). */
export function feedsToJob(feeds: FeedsForm): { fields: Partial<JobCreate>; problems: string[] } {
  const problems: string[] = [];
  const state: Record<string, string> = {};
  const initial: Record<string, number> = {};
  for (const row of feeds.state) {
    if (!row.output || !row.input) {
      problems.push('Choose both the output and the input of every state row.');
      continue;
    }
    if (Object.values(state).includes(row.input)) problems.push(`Input ${row.input} is fed from two outputs.`);
    state[row.output] = row.input;
    const value = Number(row.initial || '0');
    if (!Number.isFinite(value)) problems.push(`The first value of ${row.input} must be a number.`);
    initial[row.input] = value;
  }
  const fields: Partial<JobCreate> = Object.keys(state).length ? { state, initial_state: initial } : {};
  if (feeds.subsetCount.trim()) {
    const count = Number(feeds.subsetCount);
    const seed = Number(feeds.subsetSeed || '0');
    if (!Number.isInteger(count) || count < 1) problems.push('The calibration subset is a whole number of samples, 1 or more.');
    if (!Number.isInteger(seed) || seed < 0) problems.push('The seed is a whole number, 0 or more.');
    fields.calibration_subset = { count, seed, stratify: feeds.stratify };
  }
  return { fields, problems };
}

export function DatasetFeedsFields({
  version,
  value,
  onChange,
  hasCalibration,
}: {
  version: ModelVersion | null;
  value: FeedsForm;
  onChange: (next: FeedsForm) => void;
  hasCalibration: boolean;
}) {
  const countId = useId();
  const seedId = useId();
  const outputs = version?.signature.outputs ?? [];
  const inputs = version?.signature.inputs ?? [];
  const setRow = (index: number, patch: Partial<StateRow>) =>
    onChange({ ...value, state: value.state.map((row, at) => (at === index ? { ...row, ...patch } : row)) });
  const { problems } = feedsToJob(value);

  return (
    <div className="dataset-feeds" data-testid="dataset-feeds">
      <fieldset className="fieldset">
        <legend>State carried between calls</legend>
        <p className="muted small">
          For streaming models (voice activity, streaming speech, trackers): each sequence in the data runs call by call,
          and these outputs feed these inputs on the next call, starting from the first value.
        </p>
        {value.state.map((row, index) => (
          <div className="form-row" key={index} data-testid="state-row">
            <label className="field">
              <span>Output</span>
              <select value={row.output} onChange={(event) => setRow(index, { output: event.target.value })} data-testid="state-output">
                <option value="">Choose…</option>
                <NameOptions items={outputs} />
              </select>
            </label>
            <label className="field">
              <span>feeds input</span>
              <select value={row.input} onChange={(event) => setRow(index, { input: event.target.value })} data-testid="state-input">
                <option value="">Choose…</option>
                <NameOptions items={inputs} />
              </select>
            </label>
            <label className="field">
              <span>First value</span>
              <input inputMode="decimal" value={row.initial} onChange={(event) => setRow(index, { initial: event.target.value })} data-testid="state-initial" />
            </label>
            <button
              type="button"
              className="button button-small button-ghost"
              onClick={() => onChange({ ...value, state: value.state.filter((_, at) => at !== index) })}
            >
              Remove
            </button>
          </div>
        ))}
        <button
          type="button"
          className="button button-small"
          disabled={!version}
          onClick={() => onChange({ ...value, state: [...value.state, { output: '', input: '', initial: '0' }] })}
          data-testid="add-state"
        >
          Add a state
        </button>
      </fieldset>
      {/* Always there (disabled without calibration data), so that choosing a calibration set moves nothing below it. */}
      <fieldset className="fieldset" disabled={!hasCalibration} data-testid="calibration-samples">
        <legend>Calibration samples</legend>
        <p className="muted small">Use only some of the calibration dataset&apos;s samples, drawn with a seed (with a calibration dataset chosen above).</p>
        <div className="form-row">
          <div className="field">
            <label htmlFor={countId}>How many (empty: all)</label>
            <input id={countId} inputMode="numeric" value={value.subsetCount} onChange={(event) => onChange({ ...value, subsetCount: event.target.value })} data-testid="subset-count" />
          </div>
          <div className="field">
            <label htmlFor={seedId}>Seed</label>
            <input id={seedId} inputMode="numeric" value={value.subsetSeed} onChange={(event) => onChange({ ...value, subsetSeed: event.target.value })} data-testid="subset-seed" />
          </div>
          <label className="choice">
            <input type="checkbox" checked={value.stratify} onChange={(event) => onChange({ ...value, stratify: event.target.checked })} />
            Keep each label&apos;s share
          </label>
        </div>
      </fieldset>
      {problems.length ? (
        <ul className="field-error" data-testid="feeds-problems">
          {problems.map((problem) => (
            <li key={problem}>{problem}</li>
          ))}
        </ul>
      ) : null}
    </div>
  );
}
