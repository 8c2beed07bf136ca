/** Device agents (live) and the registration tokens that let new agents join. */
import { useId, useState } from 'react';
import { Link } from 'react-router';
import {
  rows,
  useAgentSetup,
  useAgents,
  useCreateRegistrationToken,
  useRegistrationTokens,
  useRevokeAgent,
  useRevokeRegistrationToken,
} from '../api/hooks';
import type { Agent, AgentSetup, RegistrationTokenCreated } from '../api/types';
import { CopyButton, EmptyState, ErrorMessage, PageHeader, SecretReveal, StatusBadge } from '../components/common';
import { DataTable } from '../components/DataTable';
import { InlineForm, SelectField, TextField } from '../components/FormFields';
import { ListStates } from '../components/ListStates';
import { RevokeAction } from '../components/RowAction';
import { formatDate, formatRelative } from '../format';

const ISA_SHOWN = 12;

function Capabilities({ agent }: { agent: Agent }) {
  const caps = agent.capabilities ?? {};
  const runtimes = Object.entries(caps.runtimes ?? {});
  return (
    <dl className="caps">
      {caps.cpu_model || caps.arch ? (
        <>
          <dt>CPU</dt>
          <dd title={String(caps.cpu_model ?? caps.arch)}>
            {capabilityText(String(caps.cpu_model ?? caps.arch))}
            {caps.cores ? `, ${caps.cores} cores` : ''}
            {caps.memory_mb ? `, ${Math.round(Number(caps.memory_mb) / 1024)} GB RAM` : ''}
          </dd>
        </>
      ) : null}
      {caps.os ? (
        <>
          <dt>OS</dt>
          <dd title={String(caps.os)}>
            {capabilityText(String(caps.os))}
            {caps.arch ? ` (${capabilityText(String(caps.arch), 40)})` : ''}
          </dd>
        </>
      ) : null}
      {caps.gpu ? (
        <>
          <dt>GPU</dt>
          <dd title={String((caps.gpu as { name?: string }).name ?? JSON.stringify(caps.gpu))}>
            {capabilityText(String((caps.gpu as { name?: string }).name ?? JSON.stringify(caps.gpu)))}
          </dd>
        </>
      ) : null}
      {runtimes.length ? (
        <>
          <dt>Runtimes</dt>
          <dd title={runtimes.map(([name, version]) => `${name} ${version}`).join(', ')}>
            {capabilityText(runtimes.map(([name, version]) => `${name} ${version}`).join(', '), 160)}
          </dd>
        </>
      ) : null}
      {caps.isa?.length ? (
        <>
          <dt>ISA</dt>
          <dd className="chips">
            {caps.isa.slice(0, ISA_SHOWN).map((flag) => (
              <span key={flag} className="chip" title={flag}>
                {capabilityText(flag, 40)}
              </span>
            ))}
            {caps.isa.length > ISA_SHOWN ? (
              <span className="chip" title={caps.isa.join(' ')}>+{caps.isa.length - ISA_SHOWN} more</span>
            ) : null}
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
      <DataTable columns={['Device', 'Status', 'Capabilities', { label: 'Labels', className: 'col-p3' }, { label: 'Current task', className: 'col-p2' }, 'Last heartbeat']} actions testId="agents-table">
        {agents.map((agent) => (
          <tr key={agent.id} data-testid="agent-row">
            <td>
              <strong className="agent-name" title={agent.name}>{agent.name}</strong>
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
                <span className="muted" data-testid="no-labels">no labels</span>
              ) : (
                <div className="chips">
                  {Object.entries(agent.labels).map(([key, value]) => (
                    <span key={key} className="chip" title={`${key}=${value}`}>
                      {capabilityText(`${key}=${value}`, 60)}
                    </span>
                  ))}
                </div>
              )}
            </td>
            <td>{agent.current_task ? `Task #${agent.current_task}` : <span className="muted">Idle</span>}</td>
            <td title={agent.last_heartbeat_at ?? undefined}>{formatRelative(agent.last_heartbeat_at)}</td>
            <td>
              <RevokeAction
                revoked={agent.revoked}
                label={`Revoke agent ${agent.name}`}
                question={`Revoke ${agent.name}? It stops receiving work and must register again.`}
                onConfirm={() => revoke.mutate(agent.id)}
              />
            </td>
          </tr>
        ))}
      </DataTable>
    </>
  );
}

/** A capability value short enough for a table cell; the whole value stays in the tooltip. */
export function capabilityText(value: string, limit = 80): string {
  return value.length > limit ? `${value.slice(0, limit - 1)}…` : value;
}

/** The agents that joined after a token was created: the ones that used it, as far as this page can tell. */
export function newAgents(agents: Agent[], knownIds: Set<number>): Agent[] {
  return agents.filter((agent) => !knownIds.has(agent.id) && !agent.revoked);
}

/** `kiln-agent up …`: the server's register command, as the one command that registers and runs. */
export function upCommand(registerCommand: string): string {
  return registerCommand.replace(/^kiln-agent register\b/, 'kiln-agent up');
}

/** A command the server built for its own address, with the address the devices use instead. */
export function withServer(command: string, from: string, to: string): string {
  if (!from || from === to) return command;
  return command.split(from).join(to);
}

/** The address typed for devices, without a trailing slash; null when it is not an http(s) URL. */
export function deviceAddress(text: string): string | null {
  const value = text.trim().replace(/\/+$/, '');
  try {
    const url = new URL(value);
    return (url.protocol === 'http:' || url.protocol === 'https:') && url.hostname ? value : null;
  } catch {
    return null;
  }
}

const LOOPBACK = /^(localhost|127(\.\d+){3}|\[::1\]|0\.0\.0\.0)$/i;

export function isLoopbackAddress(address: string): boolean {
  try {
    return LOOPBACK.test(new URL(address).hostname);
  } catch {
    return false;
  }
}

/** The server's address as devices reach it: what the server thinks, a warning when that is loopback, and a field to correct it. */
function ServerAddress({ setup, address, onChange }: { setup: AgentSetup; address: string; onChange: (value: string) => void }) {
  const fieldId = useId();
  const listId = useId();
  const parsed = deviceAddress(address);
  const stillLoopback = parsed !== null && isLoopbackAddress(parsed);
  return (
    <div className="server-address" data-testid="server-address">
      <div className="field">
        <label htmlFor={fieldId}>Server address, as your devices reach it</label>
        <input
          id={fieldId}
          type="url"
          value={address}
          list={listId}
          spellCheck={false}
          onChange={(event) => onChange(event.target.value)}
          aria-invalid={parsed === null || stillLoopback}
          data-testid="server-address-input"
        />
        <datalist id={listId}>
          {setup.suggested_urls.map((url) => (
            <option key={url} value={url} />
          ))}
        </datalist>
        <p className="muted small">
          {address.trim().replace(/\/+$/, '') !== setup.server_url ? (
            <>Typed here, for this page only (the server says {setup.server_url}). Set <code>KILN_PUBLIC_URL</code> on the server to keep it.</>
          ) : setup.source === 'KILN_PUBLIC_URL' ? (
            <>Set by the server&apos;s <code>KILN_PUBLIC_URL</code>.</>
          ) : (
            <>
              The address this page was opened at. Set <code>KILN_PUBLIC_URL</code> on the server to fix it for everyone.
            </>
          )}{' '}
          The commands below use this address.
        </p>
      </div>
      {parsed === null ? (
        <p className="field-error" role="alert" data-testid="server-address-error">
          Type the server&apos;s URL, e.g. http://192.168.1.20:8000.
        </p>
      ) : stillLoopback ? (
        <div className="alert alert-warn" role="alert" data-testid="loopback-warning">
          <strong>{parsed} will not work from a device.</strong> {setup.warning ?? 'It is a loopback address: on a device it means the device itself.'}
          {setup.suggested_urls.length > 0 ? (
            <div className="button-row">
              This server&apos;s addresses:
              {setup.suggested_urls.map((url) => (
                <button key={url} type="button" className="button button-small" onClick={() => onChange(url)} data-testid="suggested-address">
                  Use {url}
                </button>
              ))}
            </div>
          ) : null}
        </div>
      ) : null}
    </div>
  );
}

export const SERVICE_COMMAND = 'kiln-agent install-service';

/** Numbered steps from a fresh machine to a device that takes work, with a live check of the first heartbeat. */
export function SetupSteps({ command, knownIds, setup, address }: { command: string; knownIds: Set<number>; setup: AgentSetup; address: string }) {
  const agents = useAgents();
  const joined = newAgents(rows(agents.data), knownIds);
  const online = joined.find((agent) => agent.online);
  const register = withServer(command, setup.server_url, address);
  const up = upCommand(register);
  const install = setup.downloads_configured ? setup.install_command : withServer(setup.install_command, setup.server_url, address);
  return (
    <div className="setup-steps" data-testid="setup-steps">
      <ol>
        <li>
          <strong>Install</strong> the agent and a runtime on the device (Python 3.11+), from this server:
          <div className="secret-row">
            <pre className="code-block" data-testid="install-command"><code>{install}</code></pre>
            <CopyButton text={install} label="Copy" />
          </div>
          <span className="muted small" data-testid="runtime-choices">
            Runtimes the agent runs today:{' '}
            {setup.runtimes.map((runtime, index) => (
              <span key={runtime.name}>
                {index > 0 ? '; ' : ''}
                <code>{runtime.package}</code> ({runtime.note})
              </span>
            ))}
            . Add more than one to the command to compare them; the agent reports what it finds.
          </span>
        </li>
        <li>
          <strong>Register and run</strong> it, in one command. It registers once (the agent's token is saved in{' '}
          <code>~/.config/kiln/agent.json</code>; running it again re-uses it), then connects out to this server and takes work, so no
          inbound port is needed.
          <div className="secret-row">
            <pre className="code-block" data-testid="up-command"><code>{up}</code></pre>
            <CopyButton text={up} label="Copy command" />
          </div>
          <span className="muted small">
            The same in two steps: <code data-testid="register-command">{register}</code>, then <code data-testid="run-command">kiln-agent run</code>.
          </span>
        </li>
        <li>
          <strong>Keep it running</strong> after you log out or reboot (optional): install it as a service, a systemd user unit on Linux or a
          launchd agent on macOS, with no root needed. It prints the one command that starts it; add <code>--print</code> to see the file first.
          <div className="secret-row">
            <pre className="code-block" data-testid="service-command"><code>{SERVICE_COMMAND}</code></pre>
            <CopyButton text={SERVICE_COMMAND} label="Copy" />
          </div>
          <span className="muted small">
            Or add <code>--install-service</code> to the command of step 2: it registers and installs the service instead of running
            in the terminal.
          </span>
        </li>
      </ol>
      <div className={`first-heartbeat${online ? ' first-heartbeat-done' : ''}`} role="status" aria-live="polite" data-testid="first-heartbeat">
        {online ? (
          <>
            <StatusBadge status="online" label="Connected" /> <strong>{online.name}</strong> sent its first heartbeat{' '}
            {formatRelative(online.last_heartbeat_at)}. It is ready: <Link to="/deployments/new">start a deployment</Link>.
          </>
        ) : joined.length > 0 ? (
          <>
            <span className="spinner" aria-hidden="true" /> <strong>{joined[0].name}</strong> registered; waiting for its first heartbeat… (is{' '}
            <code>kiln-agent up</code> or <code>kiln-agent run</code> still running?)
          </>
        ) : (
          <>
            <span className="spinner" aria-hidden="true" /> Waiting for the first heartbeat… (this updates by itself)
          </>
        )}
      </div>
    </div>
  );
}

function RegistrationTokens() {
  const setup = useAgentSetup();
  const [typedAddress, setTypedAddress] = useState<string | null>(null);
  const address = typedAddress ?? setup.data?.server_url ?? '';
  const tokens = useRegistrationTokens();
  const create = useCreateRegistrationToken();
  const revoke = useRevokeRegistrationToken();
  const [name, setName] = useState('');
  const [expiresInDays, setExpiresInDays] = useState('');
  const [created, setCreated] = useState<RegistrationTokenCreated | null>(null);
  const [knownIds, setKnownIds] = useState<Set<number>>(new Set());
  const agents = useAgents();
  const list = rows(tokens.data);

  const submit = () => {
    create.mutate({ name: name.trim(), expiresInDays: expiresInDays ? Number(expiresInDays) : null }, {
      onSuccess: (token) => {
        setKnownIds(new Set(rows(agents.data).map((agent) => agent.id)));
        setCreated(token);
        setName('');
      },
    });
  };

  return (
    <section className="card" aria-labelledby="registration-heading">
      <h2 id="registration-heading">Register a device</h2>
      <p className="muted">
        On the device: install the agent, then one command registers it with a token made here and runs it; a service keeps it
        running. Create a token to see the commands; this page then waits for the device's first heartbeat.
      </p>
      {setup.data ? <ServerAddress setup={setup.data} address={address} onChange={setTypedAddress} /> : <ErrorMessage error={setup.error} />}
      <InlineForm
        label="Create registration token"
        submitLabel="Create registration token"
        disabled={create.isPending || !name.trim()}
        onSubmit={submit}
      >
        <TextField
          label="Token name"
          required
          value={name}
          placeholder="e.g. lab-x86-boxes"
          onChange={(event) => setName(event.target.value)}
          data-testid="registration-token-name"
        />
        <SelectField
          label="Expires"
          value={expiresInDays}
          onChange={(event) => setExpiresInDays(event.target.value)}
          data-testid="registration-token-expiry"
        >
          <option value="">Never</option>
          <option value="1">In 1 day</option>
          <option value="7">In 7 days</option>
          <option value="30">In 30 days</option>
          <option value="365">In a year</option>
        </SelectField>
      </InlineForm>
      <ErrorMessage error={create.error ?? revoke.error} />
      {created?.token ? (
        <SecretReveal label="Registration token" value={created.token} testId="registration-token-secret">
          {created.register_command && setup.data ? (
            <SetupSteps command={created.register_command} knownIds={knownIds} setup={setup.data} address={deviceAddress(address) ?? setup.data.server_url} />
          ) : null}
        </SecretReveal>
      ) : null}
      <ListStates pending={tokens.isPending} empty={list.length === 0}>
        <DataTable
          columns={[
            'Name',
            { label: 'Prefix', className: 'col-p3' },
            { label: 'Created', className: 'col-p2' },
            { label: 'Expires', className: 'col-p2' },
            'Status',
          ]}
          actions
          className="table table-compact table-cards"
          caption="Registration tokens"
          testId="registration-tokens-table"
        >
          {list.map((token) => (
            <tr key={token.id}>
              <td>{token.name}</td>
              <td>{token.prefix ? <code>{token.prefix}…</code> : '—'}</td>
              <td>{formatDate(token.created_at)}</td>
              <td>{token.expires_at ? formatDate(token.expires_at) : 'Never'}</td>
              <td>
                {token.revoked ? (
                  <StatusBadge status="revoked" />
                ) : token.expired ? (
                  <StatusBadge status="failed" label="Expired" />
                ) : (
                  <StatusBadge status="succeeded" label="Active" />
                )}
              </td>
              <td>
                <RevokeAction
                  revoked={token.revoked}
                  label={`Revoke registration token ${token.name}`}
                  onConfirm={() => revoke.mutate(token.id)}
                />
              </td>
            </tr>
          ))}
        </DataTable>
      </ListStates>
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
        <ListStates
          error={agents.error}
          pending={agents.isPending}
          empty={list.length === 0}
          whenEmpty={
            <EmptyState title="No devices yet.">
              Create a registration token below and run its command on a machine you want to benchmark on. It appears here
              within seconds; then <Link to="/deployments/new">start a deployment</Link>.
            </EmptyState>
          }
        >
          <AgentsTable agents={list} />
        </ListStates>
      </section>
      <RegistrationTokens />
    </>
  );
}
