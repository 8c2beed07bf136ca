/** One deployment, live: stage timeline, device tasks, event log, artifacts, cancel. */
import { Link, useNavigate, useParams } from 'react-router';
import { isTerminal, rows, useArtifacts, useCancelJob, useCanWrite, useJob, useReport, useRerunJob } from '../api/hooks';
import type { Artifact, DeviceTask, Job, JobStage, JobVariant, Report } from '../api/types';
import { variantLabel } from './report/ReportTable';
import { decisionOf, headline, tieBadge } from './report/verdict';
import { autoFigures } from '../components/outputKinds';
import { toleranceText } from '../components/tolerance';
import { EmptyState, ErrorMessage, Loading, PageHeader, ProgressBar, StatusBadge } from '../components/common';
import { DataTable } from '../components/DataTable';
import { OperatorSupportTable } from '../components/OperatorSupport';
import { formatBytes, formatDate, humanize, percent } from '../format';

/** The stage names in pipeline order, for jobs whose detail carries no stages list. */
const PIPELINE = ['validate', 'convert', 'support', 'reference', 'quantize', 'dispatch', 'devices', 'report', 'done'];

function secondsText(seconds: number): string {
  return seconds < 60 ? `${seconds.toFixed(1)} s` : `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
}

/** A stage's time over every run of it (one per search round), plus the run in progress. */
export function durationText(stage: JobStage, now = Date.now()): string {
  if (!stage.started_at) return '';
  const running = stage.status === 'running' ? Math.max(0, (now - new Date(stage.started_at).getTime()) / 1000) : 0;
  if (stage.seconds !== undefined && stage.seconds !== null) {
    const runs = (stage.runs ?? 1) + (stage.status === 'running' ? 1 : 0);
    return `${secondsText(stage.seconds + running)}${runs > 1 ? ` over ${runs} rounds` : ''}`;
  }
  const end = stage.finished_at ? new Date(stage.finished_at).getTime() : now;
  return secondsText(Math.max(0, (end - new Date(stage.started_at).getTime()) / 1000));
}

/** The search's budget of work: minutes used and left while it runs, a first answer while it refines, or why it stopped. */
export function SearchBudgetLine({ job }: { job: Job }) {
  const budget = job.budget;
  if (!budget || !('minutes' in budget)) return null;
  let text = `Search budget ${budget.minutes} min of work`;
  if (budget.work_seconds) text += ` · ${(budget.work_seconds / 60).toFixed(1)} min used`;
  if (budget.stopped) text += ` · stopped: ${budget.stopped}`;
  else if (budget.seconds_left != null) text += ` · ${Math.ceil(budget.seconds_left / 60)} min left`;
  const searching = budget.first_answer_at && !isTerminal(job.status);
  return (
    <p className="muted small" data-testid="search-budget">
      {text}
      {searching ? (
        <>
          {' · '}
          <strong data-testid="first-answer">first answer; still searching</strong>
        </>
      ) : null}
    </p>
  );
}

/** Why the job waits now, and since when ("waiting for a build slot: 2 jobs ahead"): nobody waits without word. */
export function WaitingLine({ job, now = Date.now() }: { job: Job; now?: number }) {
  const waiting = job.waiting;
  if (!waiting) return null;
  const since = waiting.since ? Math.max(0, (now - new Date(waiting.since).getTime()) / 1000) : null;
  return (
    <p className="alert alert-warn small" role="status" data-testid="job-waiting" data-cause={waiting.cause}>
      {waiting.message.charAt(0).toUpperCase() + waiting.message.slice(1)}
      {since !== null ? <span className="muted"> (for {secondsText(since)})</span> : null}
    </p>
  );
}

function stagesOf(job: Job): JobStage[] {
  if (job.stages && job.stages.length > 0) return job.stages;
  const current = PIPELINE.indexOf(job.stage);
  return PIPELINE.filter((name) => name !== 'done').map((name, index) => ({
    name,
    status: index < current || job.status === 'succeeded' ? 'done' : index === current ? (job.status === 'failed' ? 'failed' : 'running') : 'pending',
    started_at: null,
    finished_at: null,
    message: null,
  }));
}

function Timeline({ job }: { job: Job }) {
  return (
    <ol className="timeline" data-testid="stage-timeline" aria-label="Pipeline stages">
      {stagesOf(job).map((stage) => (
        <li key={stage.name} className={`timeline-step step-${stage.status}`} data-testid={`stage-${stage.name}`} data-status={stage.status}>
          <span className="timeline-dot" aria-hidden="true" />
          <div>
            <div className="timeline-title">
              {humanize(stage.name)} <StatusBadge status={stage.status} />
              <span className="muted small stage-duration"> {durationText(stage)}</span>
            </div>
            {stage.message ? (
              <div className="muted small timeline-message" title={stage.message}>
                {stage.message}
              </div>
            ) : null}
          </div>
        </li>
      ))}
    </ol>
  );
}

function DeviceTasks({ tasks, job }: { tasks: DeviceTask[]; job: Job }) {
  if (tasks.length === 0) {
    return (
      <p className="muted">
        {job.status === 'waiting_for_devices'
          ? 'Waiting for a matching device to come online. Check the Devices page.'
          : 'Device tasks appear once variants are dispatched.'}
      </p>
    );
  }
  const variantOf = (id: number) => job.variants?.find((candidate) => candidate.id === id);
  const variantName = (id: number) => {
    const variant = variantOf(id);
    return variant ? (variant.key ?? variant.precision) : `variant ${id}`;
  };
  const searched = (job.variants ?? []).some((variant) => (variant.round ?? 1) > 1);
  return (
    <DataTable
      columns={['Device', 'Variant', ...(searched ? ['Round'] : []), 'Backend', 'Status', 'Stage', 'Progress', 'Attempt']}
      testId="device-tasks"
    >
      {tasks.map((task) => (
        <tr key={task.id} data-testid="device-task-row" data-purpose={task.purpose}>
          <td>{task.agent?.name ?? task.target ?? 'Unassigned'}</td>
          <td>{task.purpose === 'retime' ? 'Finalists re-timed side by side' : variantName(task.variant)}</td>
          {searched ? <td>{variantOf(task.variant)?.round ?? 1}</td> : null}
          <td>{task.backend}</td>
          <td>
            <StatusBadge status={task.status} />
            {task.error ? <div className="field-error small">{task.error}</div> : null}
          </td>
          <td>
            {humanize(task.stage)}
            {task.message ? <div className="muted small">{task.message}</div> : null}
          </td>
          <td className="cell-progress">
            <ProgressBar
              value={task.status === 'succeeded' ? 1 : task.progress}
              label={`Progress of task ${task.id}`}
              small
            />
          </td>
          <td>{task.attempt}</td>
        </tr>
      ))}
    </DataTable>
  );
}

/** Where a variant runs, and why nowhere (or not on a runtime it was planned for): never a bare dash. */
export function runsOn(variant: JobVariant): { runtimes: string; why: string | null } {
  const refused = Object.entries((variant.recipe?.refused_backends ?? {}) as Record<string, string>)
    .map(([backend, reason]) => `not on ${backend}: ${reason}`)
    .join('; ');
  if (variant.backends.length > 0) return { runtimes: variant.backends.join(', '), why: refused || null };
  if (variant.status === 'pending' || variant.status === 'building') return { runtimes: 'decided when built', why: null };
  if (variant.status === 'skipped' || variant.status === 'failed') return { runtimes: 'none: not built', why: variant.error || null };
  return { runtimes: 'none', why: refused || 'no target runtime loads this build' };
}

/** What a variant computes in, and how its weights are stored when that differs (a bf16 variant is an FP32 build). */
export function precisionText(variant: JobVariant): { effective: string; stored: string | null } {
  const effective = variant.effective_precision || variant.precision;
  const stored = variant.precision.split('-')[0] !== effective.split(' ')[0] ? `${variant.precision} build` : null;
  return { effective, stored };
}

/** Host-side builds: what each computes in, where it runs, and the reason for each one skipped or failed. */
export function VariantList({ variants }: { variants: JobVariant[] }) {
  if (variants.length === 0) return <p className="muted">Variants are planned after the FP32 reference outputs.</p>;
  return (
    <DataTable columns={['Variant', 'Precision', 'Round', 'Status', 'Runs on']} testId="variants">
      {variants.map((variant) => {
        const where = runsOn(variant);
        const precision = precisionText(variant);
        return (
          <tr key={variant.id} data-testid="variant-row" data-key={variant.key ?? variant.precision}>
            <td><code>{variant.key ?? variant.precision}</code></td>
            <td data-testid="variant-precision">
              <div className="cell-value">
                {precision.effective}
                {precision.stored ? <div className="muted small">{precision.stored}</div> : null}
              </div>
            </td>
            <td>{variant.round ?? 1}</td>
            <td>
              <div className="cell-value">
                <StatusBadge status={variant.status} />
                {variant.error && variant.backends.length > 0 ? <div className="muted small">{variant.error}</div> : null}
              </div>
            </td>
            <td data-testid="variant-runs-on">
              <div className="cell-value">
                {where.runtimes}
                {where.why ? <div className="muted small">{where.why}</div> : null}
              </div>
            </td>
          </tr>
        );
      })}
    </DataTable>
  );
}

/** The order artifacts are listed in: what to download first, first. */
export const ARTIFACT_GROUPS: { key: string; title: string; note: string }[] = [
  { key: 'package', title: 'Deployment package', note: 'the recommended variant with its report, a signed manifest and a run script' },
  { key: 'recommended', title: 'Recommended', note: 'the variant each device should run' },
  { key: 'variant', title: 'Variants', note: 'every candidate built on the host' },
  { key: 'compiled', title: 'Compiled', note: 'engines the devices built' },
  { key: 'reference', title: 'Reference', note: 'the converted FP32 model and its reference outputs' },
];

/** Which group an artifact belongs to; `recommended` holds the ids of the recommended variants' artifacts. */
export function artifactGroup(artifact: Artifact, recommended: Set<number>): string {
  if (artifact.kind === 'package') return 'package';
  if (recommended.has(artifact.id)) return 'recommended';
  if (artifact.kind === 'variant' || artifact.kind === 'compiled') return artifact.kind;
  return 'reference';
}

function ArtifactRow({ artifact }: { artifact: Artifact }) {
  return (
    <tr data-testid="artifact-row" data-kind={artifact.kind}>
      <td>
        <code title={artifact.sha256}>{artifact.name}</code>
      </td>
      <td>{artifact.kind}</td>
      <td>{artifact.precision ?? '—'}</td>
      <td>{artifact.backend ?? '—'}</td>
      <td className="numeric">{formatBytes(artifact.size_bytes)}</td>
      <td>
        <a className="button button-small" href={artifact.download_url} download data-testid="artifact-download" aria-label={`Download ${artifact.name}`}>
          Download
        </a>
      </td>
    </tr>
  );
}

export function ArtifactList({ artifacts, recommended = new Set<number>() }: { artifacts: Artifact[]; recommended?: Set<number> }) {
  if (artifacts.length === 0) return <p className="muted">Artifacts appear as the pipeline produces them.</p>;
  return (
    <div className="table-wrap">
      <table className="table" data-testid="artifacts">
        <thead>
          <tr>
            <th scope="col">Name</th>
            <th scope="col">Kind</th>
            <th scope="col">Precision</th>
            <th scope="col">Backend</th>
            <th scope="col" className="numeric">Size</th>
            <th scope="col">
              <span className="visually-hidden">Download</span>
            </th>
          </tr>
        </thead>
        {ARTIFACT_GROUPS.map((group) => {
          const members = artifacts.filter((artifact) => artifactGroup(artifact, recommended) === group.key);
          if (members.length === 0) return null;
          return (
            <tbody key={group.key} data-testid={`artifact-group-${group.key}`}>
              <tr className="group-row">
                <th scope="rowgroup" colSpan={6}>
                  {group.title} <span className="muted small">· {group.note}</span>
                </th>
              </tr>
              {members.map((artifact) => (
                <ArtifactRow key={artifact.id} artifact={artifact} />
              ))}
            </tbody>
          );
        })}
      </table>
    </div>
  );
}

/** The ids of every recommended variant's artifacts (host-built and device-compiled). */
export function recommendedArtifactIds(report: Report | undefined): Set<number> {
  const ids = new Set<number>();
  for (const device of report?.devices ?? []) {
    const chosen = device.variants.find((variant) => variant.id === device.recommended);
    if (chosen?.artifact?.id) ids.add(chosen.artifact.id);
    const hostBuilt = (chosen as { variant_artifact?: { id: number } | null } | undefined)?.variant_artifact;
    if (hostBuilt?.id) ids.add(hostBuilt.id);
  }
  return ids;
}

/** A finished deployment's result, first: per device, what to run, how much faster, what it costs, and the package. */
export function ResultSummary({ report, jobId }: { report: Report; jobId: number }) {
  if (report.devices.length === 0) return null;
  return (
    <section className="card result-summary" aria-labelledby="result-heading" data-testid="result-summary">
      <div className="section-header">
        <h2 id="result-heading">Result</h2>
        <div className="button-row">
          <Link to={`/compare?a=${jobId}`} className="button button-small" data-testid="result-compare-link">
            Compare with…
          </Link>
          <Link to={`/jobs/${jobId}/report`} className="button button-small" data-testid="result-report-link">
            Full report
          </Link>
        </div>
      </div>
      {report.devices.map((device, index) => {
        const chosen = device.variants.find((variant) => variant.id === device.recommended);
        const name = device.agent?.name ?? device.target ?? 'Device';
        const decision = decisionOf(device);
        const badge = decision ? tieBadge(decision) : null;
        return (
          <div key={device.agent?.id ?? device.target ?? index} className="result-device" data-testid="result-device">
            <div>
              <span className="muted small">{name}</span>
              <div className="result-headline">
                {chosen ? (
                  <>
                    <span className="badge badge-recommended">Recommended</span> <strong>{decision?.label ?? variantLabel(chosen)}</strong>
                  </>
                ) : (
                  <strong>No recommendation</strong>
                )}
              </div>
              {decision?.speed || decision?.cost || badge ? (
                <ul className="verdict-facts">
                  {decision?.speed ? <li data-testid="result-speedup">{decision.speed}</li> : null}
                  {decision?.cost ? <li>{decision.cost}</li> : null}
                  {badge ? <li><span className="badge badge-tie">{badge}</span></li> : null}
                </ul>
              ) : null}
              <p className="small result-verdict">{headline(device)}</p>
            </div>
            {device.package ? (
              <a className="button button-primary button-small" href={device.package.download_url} download data-testid="result-package-download">
                Download package
              </a>
            ) : null}
          </div>
        );
      })}
    </section>
  );
}

export function JobPage() {
  const jobId = Number(useParams().jobId);
  const job = useJob(jobId);
  const cancel = useCancelJob(jobId);
  const rerun = useRerunJob(jobId);
  const navigate = useNavigate();
  const canWrite = useCanWrite();
  const artifacts = useArtifacts(jobId, job.data?.status);
  const finished = job.data?.status === 'succeeded';
  const report = useReport(jobId, finished);

  if (job.isPending) return <Loading />;
  if (job.isError && !job.data) return <ErrorMessage error={job.error} />;
  const data = job.data as Job;
  const terminal = isTerminal(data.status);
  const events = [...(data.events ?? [])].reverse();

  return (
    <>
      <PageHeader
        documentTitle={`Deployment #${data.id}`}
        title={
          <>
            Deployment #{data.id} <StatusBadge status={data.status} />
          </>
        }
        subtitle={
          <>
            {data.model ? <Link to={`/models/${data.model.id}`}>{data.model.name}</Link> : `Model version ${data.model_version}`}
            {' · '}precisions {data.precisions?.join(', ')} ·{' '}
            <span data-testid="job-tolerance">
              {data.tolerance ? toleranceText(data.tolerance, data.evaluation?.outputs ? autoFigures(data.evaluation.outputs, !!data.evaluation.labels) : null) : 'tolerance —'}
            </span>
            {' · '}started {formatDate(data.created_at)}
            {data.rerun_of ? (
              <>
                {' · '}re-run of <Link to={`/jobs/${data.rerun_of}`}>#{data.rerun_of}</Link>
              </>
            ) : null}
          </>
        }
        actions={
          <>
            {!terminal ? (
              <button
                type="button"
                className="button button-danger"
                disabled={cancel.isPending}
                onClick={() => {
                  if (window.confirm('Cancel this deployment? Running device tasks stop within a heartbeat.')) cancel.mutate();
                }}
                data-testid="cancel-job"
              >
                {cancel.isPending ? 'Canceling…' : 'Cancel deployment'}
              </button>
            ) : null}
            {terminal && canWrite ? (
              <button
                type="button"
                className="button"
                disabled={rerun.isPending}
                onClick={() => rerun.mutate(undefined, { onSuccess: (job) => navigate(`/jobs/${job.id}`) })}
                data-testid="rerun-job"
              >
                {rerun.isPending ? 'Starting…' : 'Re-run'}
              </button>
            ) : null}
            {data.status === 'succeeded' || data.stage === 'report' || data.stage === 'done' ? (
              <Link to={`/jobs/${data.id}/report`} className="button button-primary" data-testid="open-report">
                Open report
              </Link>
            ) : null}
          </>
        }
      />
      <ErrorMessage error={cancel.error} />
      <ErrorMessage error={rerun.error} />
      {job.isError ? <ErrorMessage error={job.error} title="Live updates paused:" /> : null}
      {data.error ? (
        <div className="alert alert-error" role="alert" data-testid="job-error">
          <strong>The deployment failed:</strong> {data.error}
        </div>
      ) : null}

      {finished && report.data ? <ResultSummary report={report.data} jobId={data.id} /> : null}

      <section className="card" aria-labelledby="progress-heading">
        <div className="section-header">
          <h2 id="progress-heading">Progress</h2>
          <span className="muted" data-testid="job-status" data-status={data.status} aria-live="polite">
            {humanize(data.status)} · {humanize(data.stage)} · {percent(data.progress)}
          </span>
        </div>
        <ProgressBar value={terminal && data.status === 'succeeded' ? 1 : data.progress} label="Deployment progress" />
        <WaitingLine job={data} />
        <SearchBudgetLine job={data} />
        <Timeline job={data} />
      </section>

      {data.support?.answers?.length ? (
        <section className="card" aria-labelledby="support-heading" data-testid="job-operator-support">
          <h2 id="support-heading">Operator support</h2>
          <p className="muted small">
            Asked of each runtime before anything was built. A runtime that cannot run the model is skipped for this job, with its reason.
          </p>
          <OperatorSupportTable answers={data.support.answers} />
        </section>
      ) : null}
      <section className="card" aria-labelledby="variants-heading">
        <h2 id="variants-heading">Variants</h2>
        <VariantList variants={data.variants ?? []} />
      </section>

      <section className="card" aria-labelledby="tasks-heading">
        <h2 id="tasks-heading">Device tasks</h2>
        <DeviceTasks tasks={data.device_tasks ?? []} job={data} />
      </section>

      <section className="card" aria-labelledby="artifacts-heading">
          <h2 id="artifacts-heading">Artifacts</h2>
          <ErrorMessage error={artifacts.error} />
          {artifacts.isPending ? <Loading /> : <ArtifactList artifacts={rows(artifacts.data)} recommended={recommendedArtifactIds(report.data)} />}
      </section>
      <section className="card" aria-labelledby="events-heading">
          <h2 id="events-heading">Event log</h2>
          {events.length === 0 ? (
            <EmptyState title="No events yet." />
          ) : (
            <ol className="event-log" data-testid="event-log" aria-live="polite">
              {events.map((event, index) => (
                <li key={`${event.at}-${index}`} className={`event event-${event.level}`}>
                  <time className="muted small" dateTime={event.at}>
                    {new Date(event.at).toLocaleTimeString()}
                  </time>
                  {event.stage ? <span className="chip">{event.stage}</span> : null}
                  <span>{event.message}</span>
                </li>
              ))}
            </ol>
          )}
      </section>
    </>
  );
}
