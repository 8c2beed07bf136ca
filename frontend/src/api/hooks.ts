/** React Query bindings for every resource the UI reads or writes. */
import { useEffect, useState } from 'react';
import { useMutation, useQuery, useQueryClient, type Query } from '@tanstack/react-query';
import { api, ApiError, apiUrl } from './client';
import type {
  Agent,
  AgentSetup,
  ApiToken,
  ApiTokenCreated,
  Artifact,
  Dataset,
  Job,
  JobCreate,
  Me,
  Measurement,
  Member,
  Model,
  ModelEstimate,
  ModelVersion,
  Paginated,
  RegistrationToken,
  RegistrationTokenCreated,
  Report,
  Role,
} from './types';
import { TERMINAL_JOB_STATUSES } from './types';

/** Lists may come paginated ({results}) or plain; the UI only needs the rows. */
export function rows<T>(data: Paginated<T> | T[] | undefined | null): T[] {
  if (!data) return [];
  return Array.isArray(data) ? data : data.results ?? [];
}

/** How many rows the whole list has: the server's count when paginated, else the rows at hand. */
export function totalCount<T>(data: Paginated<T> | T[] | undefined | null): number {
  return data && !Array.isArray(data) ? data.count : rows(data).length;
}

export const JOB_POLL_MS = 1500;
export const PAGE_SIZE = 50;

/** `?page=N&…` for a list route; empty values are left out. */
export function listQuery(params: Record<string, string | number | boolean | null | undefined>): string {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== '' && value !== false) search.set(key, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : '';
}
export const AGENT_POLL_MS = 5000;

export const keys = {
  me: ['me'] as const,
  models: (search: string, page = 1) => ['models', { search, page }] as const,
  model: (id: number) => ['models', id] as const,
  datasets: ['datasets'] as const,
  jobs: ['jobs'] as const,
  performance: ['performance'] as const,
  job: (id: number) => ['jobs', id] as const,
  artifacts: (id: number) => ['jobs', id, 'artifacts'] as const,
  report: (id: number) => ['jobs', id, 'report'] as const,
  agents: ['agents'] as const,
  registrationTokens: ['registration-tokens'] as const,
  agentSetup: ['agent-setup'] as const,
  tokens: ['tokens'] as const,
  members: ['members'] as const,
};

/** The signed-in user, or null when the session is anonymous (401). */
export function useMe() {
  return useQuery({
    queryKey: keys.me,
    queryFn: async () => {
      try {
        return await api<Me>('auth/me/');
      } catch (error) {
        if (error instanceof ApiError && (error.status === 401 || error.status === 403)) return null;
        throw error;
      }
    },
    staleTime: 60_000,
  });
}

/** Whether the current member may change things (viewers may only read). */
export function useCanWrite(): boolean {
  const me = useMe().data;
  return !!me?.organization && me.organization.role !== 'viewer';
}

export function useLogin() {
  const client = useQueryClient();
  return useMutation({
    mutationFn: (body: { username: string; password: string }) =>
      api<Me>('auth/login/', { method: 'POST', body }),
    onSuccess: (me) => {
      client.clear();
      client.setQueryData(keys.me, me);
    },
  });
}

export function useSignup() {
  const client = useQueryClient();
  return useMutation({
    mutationFn: (body: { username: string; password: string; organization: string }) =>
      api<Me>('auth/signup/', { method: 'POST', body }),
    onSuccess: (me) => {
      client.clear();
      client.setQueryData(keys.me, me);
    },
  });
}

export function useLogout() {
  const client = useQueryClient();
  return useMutation({
    mutationFn: () => api<null>('auth/logout/', { method: 'POST' }),
    onSettled: () => {
      client.clear();
      client.setQueryData(keys.me, null);
    },
  });
}

export function useSwitchOrganization() {
  const client = useQueryClient();
  return useMutation({
    mutationFn: (organization: number) =>
      api<Me>('auth/organization/', { method: 'POST', body: { organization } }),
    onSuccess: () => {
      // Everything cached, and everything mounted, shows the previous organization's data: start
      // the app afresh rather than risk a page mixing two tenants.
      client.clear();
      window.location.assign('/models');
    },
  });
}

export function useModels(search: string, page = 1, pageSize = PAGE_SIZE) {
  const query = search.trim();
  return useQuery({
    queryKey: [...keys.models(query, page), pageSize],
    queryFn: ({ signal }) =>
      api<Paginated<Model> | Model[]>(`models/${listQuery({ search: query, page: page > 1 ? page : null, page_size: pageSize !== PAGE_SIZE ? pageSize : null })}`, { signal }),
    placeholderData: (previous) => previous,
  });
}

export function useModel(id: number) {
  return useQuery({ queryKey: keys.model(id), queryFn: () => api<Model>(`models/${id}/`), enabled: id > 0 });
}

export function useModelVersions(id: number | null) {
  return useQuery({
    queryKey: ['models', id, 'versions'],
    queryFn: () => api<Paginated<ModelVersion> | ModelVersion[]>(`models/${id}/versions/`),
    enabled: !!id,
  });
}

export function useSetOutputKinds(modelId: number, versionNumber: number) {
  const client = useQueryClient();
  return useMutation({
    mutationFn: (outputKinds: Record<string, string | null>) =>
      api<ModelVersion>(`models/${modelId}/versions/${versionNumber}/`, { method: 'PATCH', body: { output_kinds: outputKinds } }),
    onSuccess: () => client.invalidateQueries({ queryKey: keys.model(modelId) }),
  });
}

export function useDeleteModel() {
  const client = useQueryClient();
  return useMutation({
    mutationFn: (id: number) => api<null>(`models/${id}/`, { method: 'DELETE' }),
    onSuccess: () => client.invalidateQueries({ queryKey: ['models'] }),
  });
}

export function useDatasets(page = 1, pageSize = PAGE_SIZE) {
  return useQuery({
    queryKey: [...keys.datasets, { page, pageSize }],
    queryFn: () => api<Paginated<Dataset> | Dataset[]>(`datasets/${listQuery({ page: page > 1 ? page : null, page_size: pageSize !== PAGE_SIZE ? pageSize : null })}`),
    placeholderData: (previous) => previous,
  });
}

export function useDeleteDataset() {
  const client = useQueryClient();
  return useMutation({
    mutationFn: (id: number) => api<null>(`datasets/${id}/`, { method: 'DELETE' }),
    onSuccess: () => client.invalidateQueries({ queryKey: keys.datasets }),
  });
}

export function isTerminal(status: string | undefined): boolean {
  return !!status && (TERMINAL_JOB_STATUSES as string[]).includes(status);
}

export function useJobs(page = 1, model: number | null = null) {
  return useQuery({
    queryKey: [...keys.jobs, { page, model }],
    queryFn: () => api<Paginated<Job> | Job[]>(`jobs/${listQuery({ page: page > 1 ? page : null, model })}`),
    placeholderData: (previous) => previous,
    refetchInterval: (query) =>
      rows(query.state.data).some((job) => !isTerminal(job.status)) ? 3000 : false,
  });
}

function pollWhileRunning(query: Query<Job, Error, Job, readonly ["jobs", number]>): number | false {
  if (query.state.error) return 5000;
  return isTerminal(query.state.data?.status) ? false : JOB_POLL_MS;
}

/**
 * Live job updates pushed by the server (server-sent events); returns whether the stream is open.
 * While it is, the job query does not poll; when the browser has no EventSource or the stream
 * fails, polling takes over again.
 */
export function useJobStream(id: number, enabled: boolean): boolean {
  const client = useQueryClient();
  const [open, setOpen] = useState(false);
  useEffect(() => {
    if (!enabled || typeof EventSource === 'undefined') return undefined;
    const source = new EventSource(apiUrl(`jobs/${id}/stream/`));
    source.addEventListener('job', (event) => {
      const job = JSON.parse((event as MessageEvent<string>).data) as Job;
      client.setQueryData(keys.job(id), job);
      if (isTerminal(job.status)) {
        void client.invalidateQueries({ queryKey: keys.report(id) });
        source.close();
        setOpen(false);
      }
    });
    source.onopen = () => setOpen(true);
    source.onerror = () => {
      // EventSource reconnects by itself while it can; a closed one means the server refused.
      if (source.readyState === EventSource.CLOSED) setOpen(false);
    };
    return () => {
      source.close();
      setOpen(false);
    };
  }, [client, id, enabled]);
  return open;
}

export function useJob(id: number) {
  // The stream starts once the job is known to be running; every render after the first fetch sees it in the cache.
  const cached = useQueryClient().getQueryData<Job>(keys.job(id));
  const streaming = useJobStream(id, !!cached && !isTerminal(cached.status));
  return useQuery({
    queryKey: keys.job(id),
    queryFn: () => api<Job>(`jobs/${id}/`),
    refetchInterval: (current) => (streaming ? false : pollWhileRunning(current)),
  });
}

export function useRerunJob(id: number) {
  const client = useQueryClient();
  return useMutation({
    mutationFn: () => api<Job>(`jobs/${id}/rerun/`, { method: 'POST' }),
    onSuccess: (job) => {
      client.setQueryData(keys.job(job.id), job);
      void client.invalidateQueries({ queryKey: keys.jobs });
    },
  });
}

export interface PerformanceFilters {
  model?: number | null;
  agent?: number | null;
  backend?: string;
  precision?: string;
  job?: number | null;
  regression?: boolean;
  ordering?: string;
}

export function usePerformance(filters: PerformanceFilters, page = 1, pageSize = PAGE_SIZE) {
  const query = listQuery({ ...filters, regression: filters.regression ? 'true' : null, page: page > 1 ? page : null, page_size: pageSize !== PAGE_SIZE ? pageSize : null });
  return useQuery({
    queryKey: [...keys.performance, query],
    queryFn: () => api<Paginated<Measurement>>(`performance/${query}`),
    placeholderData: (previous) => previous,
  });
}

export function useEstimate(versionId: number | null) {
  return useQuery({
    queryKey: ['estimate', versionId],
    queryFn: () => api<ModelEstimate>(`performance/estimate/?model_version=${versionId}`),
    enabled: !!versionId,
    staleTime: 60_000,
  });
}

export function useCreateJob() {
  const client = useQueryClient();
  return useMutation({
    mutationFn: (body: JobCreate) => api<Job>('jobs/', { method: 'POST', body }),
    onSuccess: (job) => {
      client.setQueryData(keys.job(job.id), job);
      void client.invalidateQueries({ queryKey: keys.jobs, exact: true });
    },
  });
}

export function useCancelJob(id: number) {
  const client = useQueryClient();
  return useMutation({
    mutationFn: () => api<Job>(`jobs/${id}/cancel/`, { method: 'POST' }),
    onSuccess: (job) => client.setQueryData(keys.job(id), job),
  });
}

export function useArtifacts(id: number, jobStatus: string | undefined) {
  return useQuery({
    // The status is part of the key so that the list is fetched once more when the job ends.
    queryKey: [...keys.artifacts(id), jobStatus],
    queryFn: () => api<Paginated<Artifact> | Artifact[]>(`jobs/${id}/artifacts/`),
    enabled: !!jobStatus,
    placeholderData: (previous) => previous,
    refetchInterval: isTerminal(jobStatus) ? false : 3000,
  });
}

export function useReport(id: number, enabled = true) {
  return useQuery({
    enabled,
    queryKey: keys.report(id),
    queryFn: () => api<Report>(`jobs/${id}/report/`),
    refetchInterval: (query) => (query.state.data && !isTerminal(query.state.data.status) ? 3000 : false),
    retry: (count, error) => !(error instanceof ApiError && error.status === 404) && count < 2,
  });
}

export function useAgents() {
  return useQuery({
    queryKey: keys.agents,
    queryFn: () => api<Paginated<Agent> | Agent[]>('agents/'),
    refetchInterval: AGENT_POLL_MS,
  });
}

export function useRevokeAgent() {
  const client = useQueryClient();
  return useMutation({
    mutationFn: (id: number) => api<Agent>(`agents/${id}/revoke/`, { method: 'POST' }),
    onSuccess: () => client.invalidateQueries({ queryKey: keys.agents }),
  });
}

export function useAgentSetup() {
  return useQuery({ queryKey: keys.agentSetup, queryFn: () => api<AgentSetup>('agents/setup/'), staleTime: Infinity });
}

export function useRegistrationTokens() {
  return useQuery({
    queryKey: keys.registrationTokens,
    queryFn: () => api<Paginated<RegistrationToken> | RegistrationToken[]>('agents/registration-tokens/'),
  });
}

export function useCreateRegistrationToken() {
  const client = useQueryClient();
  return useMutation({
    mutationFn: ({ name, expiresInDays }: { name: string; expiresInDays: number | null }) =>
      api<RegistrationTokenCreated>('agents/registration-tokens/', {
        method: 'POST',
        body: expiresInDays ? { name, expires_in_days: expiresInDays } : { name },
      }),
    onSuccess: () => client.invalidateQueries({ queryKey: keys.registrationTokens }),
  });
}

export function useRevokeRegistrationToken() {
  const client = useQueryClient();
  return useMutation({
    mutationFn: (id: number) =>
      api<RegistrationToken>(`agents/registration-tokens/${id}/revoke/`, { method: 'POST' }),
    onSuccess: () => client.invalidateQueries({ queryKey: keys.registrationTokens }),
  });
}

export function useTokens() {
  return useQuery({ queryKey: keys.tokens, queryFn: () => api<Paginated<ApiToken> | ApiToken[]>('tokens/') });
}

export function useCreateToken() {
  const client = useQueryClient();
  return useMutation({
    mutationFn: (body: { name: string; expires_in_days: number | null }) =>
      api<ApiTokenCreated>('tokens/', { method: 'POST', body }),
    onSuccess: () => client.invalidateQueries({ queryKey: keys.tokens }),
  });
}

export function useRevokeToken() {
  const client = useQueryClient();
  return useMutation({
    mutationFn: (id: number) => api<ApiToken>(`tokens/${id}/revoke/`, { method: 'POST' }),
    onSuccess: () => client.invalidateQueries({ queryKey: keys.tokens }),
  });
}

export function useMembers() {
  return useQuery({ queryKey: keys.members, queryFn: () => api<Paginated<Member> | Member[]>('members/') });
}

/** After a change to the signed-in user's own membership, their role (and maybe access) changed too. */
function refreshMembers(client: ReturnType<typeof useQueryClient>) {
  void client.invalidateQueries({ queryKey: keys.members });
  void client.invalidateQueries({ queryKey: keys.me });
}

export function useAddMember() {
  const client = useQueryClient();
  return useMutation({
    mutationFn: (body: { username: string; role: Role }) => api<Member>('members/', { method: 'POST', body }),
    onSuccess: () => client.invalidateQueries({ queryKey: keys.members }),
  });
}

export function useChangeMemberRole() {
  const client = useQueryClient();
  return useMutation({
    mutationFn: ({ id, role }: { id: number; role: Role }) => api<Member>(`members/${id}/`, { method: 'PATCH', body: { role } }),
    onSuccess: () => refreshMembers(client),
  });
}

export function useRemoveMember() {
  const client = useQueryClient();
  return useMutation({
    mutationFn: (id: number) => api<null>(`members/${id}/`, { method: 'DELETE' }),
    onSuccess: () => refreshMembers(client),
  });
}
