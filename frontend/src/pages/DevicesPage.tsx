/** Device agents (live) and the registration tokens that let new agents join. */
import { useId, useState, type FormEvent } from 'react';
import { Link } from 'react-router';
import {
  rows,
  useAgents,
  useCreateRegistrationToken,
  useRegistrationTokens,
  useRevokeAgent,
  useRevokeRegistrationToken,
} from '../api/hooks';
import type { Agent, RegistrationToken } from '../api/types';
import { CopyButton, EmptyState, ErrorMessage, Loading, PageHeader, SecretReveal, StatusBadge } from '../components/common';
import { formatDate, formatRelative } from '../format';

function Capabilities({ agent }: { agent: Agent }) {
  const caps = agent.capabilities ?? {};
  const runtimes = Object.entries(caps.runtimes ?? {});
  return (
    <dl className="caps">
      {caps.cpu_model || caps.arch ? (
        <>
          <dt>CPU</dt>
          <dd>
            {caps.cpu_model ?? caps.arch}
            {caps.cores ? `, ${caps.cores} cores` : ''}
            {caps.memory_mb ? `, ${Math.round(Number(caps.memory_mb) / 1024)} GB RAM` : ''}
          </dd>
        </>
      ) : null}
      {caps.os ? (
        <>
          <dt>OS</dt>
          <dd>
            {caps.os}
            {caps.arch ? ` (${caps.arch})` : ''}
          </dd>
        </>
      ) : null}
      {caps.gpu ? (
        <>
          <dt>GPU</dt>
          <dd>{String((caps.gpu as { name?: string }).name ?? JSON.stringify(caps.gpu))}</dd>
        </>
      ) : null}
      {runtimes.length ? (
        <>
          <dt>Runtimes</dt>
          <dd>{runtimes.map(([name, version]) => `${name} ${version}`).join(', ')}</dd>
        </>
      ) : null}
      {caps.isa?.length ? (
        <>
          <dt>ISA</dt>
          <dd className="chips">
            {caps.isa.map((flag) => (
              <span key={flag} className="chip">
                {flag}
              </span>
            ))}
          </dd>
        </>
      ) : null}
    </dl>
  );
}

function AgentsTable({ agents }: { agents: Agent[] }) {
  const revoke = useRevokeAgent();
  return (
    <>
      <ErrorMessage error={revoke.error} />
      <div className="table-wrap">
        <table className="table" data-testid="agents-table">
          <thead>
            <tr>
              <th scope="col">Device</th>
              <th scope="col">Status</th>
              <th scope="col">Capabilities</th>
              <th scope="col">Labels</th>
              <th scope="col">Current task</th>
              <th scope="col">Last heartbeat</th>
              <th scope="col">
                <span className="visually-hidden">Actions</span>
              </th>
            </tr>
          </thead>
          <tbody>
            {agents.map((agent) => (
              <tr key={agent.id} data-testid="agent-row">
                <td>
                  <strong>{agent.name}</strong>
                  <div className="muted small">#{agent.id}{agent.capabilities?.agent_version ? ` · agent ${agent.capabilities.agent_version}` : ''}</div>
                </td>
                <td>
                  {agent.revoked ? (
                    <StatusBadge status="revoked" />
                  ) : (
                    <StatusBadge status={agent.online ? 'online' : 'offline'} />
                  )}
                </td>
                <td>
                  <Capabilities agent={agent} />
                </td>
                <td>
                  {Object.keys(agent.labels ?? {}).length === 0 ? (
                    <span className="muted">None</span>
                  ) : (
                    <div className="chips">
                      {Object.entries(agent.labels).map(([key, value]) => (
                        <span key={key} className="chip">
                          {key}={value}
                        </span>
                      ))}
                    </div>
                  )}
                </td>
                <td>{agent.current_task ? `Task #${agent.current_task}` : <span className="muted">Idle</span>}</td>
                <td title={agent.last_heartbeat_at ?? undefined}>{formatRelative(agent.last_heartbeat_at)}</td>
                <td>
                  {!agent.revoked ? (
                    <button
                      type="button"
                      className="button button-small button-ghost"
                      aria-label={`Revoke agent ${agent.name}`}
                      onClick={() => {
                        if (window.confirm(`Revoke ${agent.name}? It stops receiving work and must register again.`)) revoke.mutate(agent.id);
                      }}
                    >
                      Revoke
                    </button>
                  ) : null}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </>
  );
}

function RegistrationTokens() {
  const tokens = useRegistrationTokens();
  const create = useCreateRegistrationToken();
  const revoke = useRevokeRegistrationToken();
  const [name, setName] = useState('');
  const [created, setCreated] = useState<RegistrationToken | null>(null);
  const nameId = useId();
  const list = rows(tokens.data);

  const submit = (event: FormEvent) => {
    event.preventDefault();
    create.mutate(name.trim(), {
      onSuccess: (token) => {
        setCreated(token);
        setName('');
      },
    });
  };

  return (
    <section className="card" aria-labelledby="registration-heading">
      <h2 id="registration-heading">Register a device</h2>
      <p className="muted">
        Create a registration token, then run the command it shows on the device (with <code>pip install kiln</code> and a
        runtime installed). The agent connects out to this server; no inbound ports are needed.
      </p>
      <form className="form-row" onSubmit={submit} aria-label="Create registration token">
        <div className="field">
          <label htmlFor={nameId}>Token name</label>
          <input
            id={nameId}
            required
            value={name}
            placeholder="e.g. lab-x86-boxes"
            onChange={(event) => setName(event.target.value)}
            data-testid="registration-token-name"
          />
        </div>
        <div className="field field-end">
          <button type="submit" className="button button-primary" disabled={create.isPending || !name.trim()}>
            Create registration token
          </button>
        </div>
      </form>
      <ErrorMessage error={create.error ?? revoke.error} />
      {created?.token ? (
        <SecretReveal label="Registration token" value={created.token} testId="registration-token-secret">
          {created.register_command ? (
            <div className="command">
              <p className="small">Run this on the device:</p>
              <div className="secret-row">
                <pre className="code-block" data-testid="register-command">
                  <code>{created.register_command}</code>
                </pre>
                <CopyButton text={created.register_command} label="Copy command" />
              </div>
            </div>
          ) : null}
        </SecretReveal>
      ) : null}
      {tokens.isPending ? (
        <Loading />
      ) : list.length === 0 ? null : (
        <div className="table-wrap">
          <table className="table table-compact" data-testid="registration-tokens-table">
            <caption>Registration tokens</caption>
            <thead>
              <tr>
                <th scope="col">Name</th>
                <th scope="col">Prefix</th>
                <th scope="col">Created</th>
                <th scope="col">Status</th>
                <th scope="col">
                  <span className="visually-hidden">Actions</span>
                </th>
              </tr>
            </thead>
            <tbody>
              {list.map((token) => (
                <tr key={token.id}>
                  <td>{token.name}</td>
                  <td>{token.prefix ? <code>{token.prefix}…</code> : '—'}</td>
                  <td>{formatDate(token.created_at)}</td>
                  <td>{token.revoked ? <StatusBadge status="revoked" /> : <StatusBadge status="succeeded" label="Active" />}</td>
                  <td>
                    {!token.revoked ? (
                      <button
                        type="button"
                        className="button button-small button-ghost"
                        aria-label={`Revoke registration token ${token.name}`}
                        onClick={() => revoke.mutate(token.id)}
                      >
                        Revoke
                      </button>
                    ) : null}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </section>
  );
}

export function DevicesPage() {
  const agents = useAgents();
  const list = rows(agents.data);
  const online = list.filter((agent) => agent.online && !agent.revoked).length;
  return (
    <>
      <PageHeader
        title="Devices"
        subtitle={
          agents.data ? (
            <span aria-live="polite">
              {online} of {list.length} online · refreshed every few seconds
            </span>
          ) : null
        }
      />
      <section className="card" aria-labelledby="agents-heading">
        <h2 id="agents-heading">Agents</h2>
        <ErrorMessage error={agents.error} />
        {agents.isPending ? (
          <Loading />
        ) : list.length === 0 ? (
          <EmptyState title="No devices yet.">
            Create a registration token below and run its command on a machine you want to benchmark on. It appears here
            within seconds; then <Link to="/deployments/new">start a deployment</Link>.
          </EmptyState>
        ) : (
          <AgentsTable agents={list} />
        )}
      </section>
      <RegistrationTokens />
    </>
  );
}
