/** Every deployment of the organization, newest first. */
import { useState } from 'react';
import { Link } from 'react-router';
import { PAGE_SIZE, rows, totalCount, useJobs } from '../api/hooks';
import { EmptyState, PageHeader, Pager, ProgressBar, StatusBadge } from '../components/common';
import { DataTable } from '../components/DataTable';
import { ListStates } from '../components/ListStates';
import { formatDate, humanize } from '../format';
import { OUTCOME_COLUMNS, OutcomeCells } from './outcome';

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
      <ListStates
        error={jobs.error}
        pending={jobs.isPending}
        empty={list.length === 0}
        whenEmpty={
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
        }
      >
        <DataTable
          columns={['Job', 'Model', 'Status', { label: 'Stage', className: 'col-p3' }, { label: 'Progress', className: 'col-p2' }, ...OUTCOME_COLUMNS, { label: 'Started', className: 'col-p3' }]}
          wrapClassName="card table-wrap"
          testId="jobs-table"
          footer={<Pager page={page} count={totalCount(jobs.data)} pageSize={PAGE_SIZE} onPage={setPage} label="Deployments" />}
        >
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
        </DataTable>
      </ListStates>
    </>
  );
}
