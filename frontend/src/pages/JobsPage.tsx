/** Every deployment of the organization, newest first. */
import { useState } from 'react';
import { Link } from 'react-router';
import { PAGE_SIZE, rows, useJobs } from '../api/hooks';
import { EmptyState, ErrorMessage, Loading, PageHeader, Pager, ProgressBar, StatusBadge } from '../components/common';
import { formatDate, humanize } from '../format';
import { OutcomeCells } from './outcome';

export function JobsPage() {
  const [page, setPage] = useState(1);
  const jobs = useJobs(page);
  const list = rows(jobs.data);
  return (
    <>
      <PageHeader
        title="Deployments"
        actions={
          <Link to="/deployments/new" className="button button-primary" data-testid="new-deployment">
            New deployment
          </Link>
        }
      />
      <ErrorMessage error={jobs.error} />
      {jobs.isPending ? (
        <Loading />
      ) : list.length === 0 ? (
        <EmptyState
          title="No deployments yet."
          action={
            <Link to="/deployments/new" className="button button-primary">
              Start your first deployment
            </Link>
          }
        >
          A deployment quantizes a model version, benchmarks every variant on your devices and recommends one.
        </EmptyState>
      ) : (
        <div className="card table-wrap">
          <table className="table" data-testid="jobs-table">
            <thead>
              <tr>
                <th scope="col">Job</th>
                <th scope="col">Model</th>
                <th scope="col">Status</th>
                <th scope="col">Stage</th>
                <th scope="col">Progress</th>
                <th scope="col">Outcome</th>
                <th scope="col" className="numeric">Speed-up vs FP32</th>
                <th scope="col">Started</th>
              </tr>
            </thead>
            <tbody>
              {list.map((job) => (
                <tr key={job.id} data-testid="job-row">
                  <td>
                    <Link to={`/jobs/${job.id}`}>#{job.id}</Link>
                    {job.rerun_of ? <div className="muted small">re-run of #{job.rerun_of}</div> : null}
                  </td>
                  <td>{job.model ? <Link to={`/models/${job.model.id}`}>{job.model.name}</Link> : `version ${job.model_version}`}</td>
                  <td>
                    <StatusBadge status={job.status} />
                  </td>
                  <td>{humanize(job.stage)}</td>
                  <td className="cell-progress">
                    <ProgressBar value={job.progress} label={`Progress of job ${job.id}`} small />
                  </td>
                  <OutcomeCells outcome={job.outcome} />
                  <td>
                    {formatDate(job.created_at)}
                    {job.status === 'succeeded' ? (
                      <div className="small">
                        <Link to={`/jobs/${job.id}/report`}>Report</Link>
                      </div>
                    ) : null}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
          <Pager page={page} count={jobs.data && !Array.isArray(jobs.data) ? jobs.data.count : list.length} pageSize={PAGE_SIZE} onPage={setPage} label="Deployments" />
        </div>
      )}
    </>
  );
}
