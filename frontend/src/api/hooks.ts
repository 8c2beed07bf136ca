/** React Query bindings for every resource the UI reads or writes. */
import { useMutation, useQuery, useQueryClient, type Query } from '@tanstack/react-query';
import { api, ApiError } from './client';
import type {
  Agent,
  ApiToken,
  Artifact,
  Dataset,
  Job,
  JobCreate,
  Me,
  Member,
  Model,
  ModelVersion,
  Paginated,
  RegistrationToken,
  Report,
  Role,
} from './types';
import { TERMINAL_JOB_STATUSES } from './types';

/** Lists may come paginated ({results}) or plain; the UI only needs the rows. */
export function rows<T>(data: Paginated<T> | T[] | undefined | null): T[] {
  if (!data) return [];
  return Array.isArray(data) ? data : data.results ?? [];
}

export const JOB_POLL_MS = 1500;
export const AGENT_POLL_MS = 5000;

export const keys = {
  me: ['me'] as const,
  models: (search: string) => ['models', { search }] as const,
  model: (id: number) => ['models', id] as const,
  datasets: ['datasets'] as const,
  jobs: ['jobs'] as const,
  job: (id: number) => ['jobs', id] as const,
  artifacts: (id: number) => ['jobs', id, 'artifacts'] as const,
  report: (id: number) => ['jobs', id, 'report'] as const,
  agents: ['agents'] as const,
  registrationTokens: ['registration-tokens'] as const,
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

export function useModels(search: string) {
  const query = search.trim();
  return useQuery({
    queryKey: keys.models(query),
    queryFn: ({ signal }) =>
      api<Paginated<Model> | Model[]>(`models/${query ? `?search=${encodeURIComponent(query)}` : ''}`, { signal }),
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

export function useDatasets() {
  return useQuery({ queryKey: keys.datasets, queryFn: () => api<Paginated<Dataset> | Dataset[]>('datasets/') });
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

export function useJobs() {
  return useQuery({
    queryKey: keys.jobs,
    queryFn: () => api<Paginated<Job> | Job[]>('jobs/'),
    refetchInterval: (query) =>
      rows(query.state.data).some((job) => !isTerminal(job.status)) ? 3000 : false,
  });
}

function pollWhileRunning(query: Query<Job, Error, Job, readonly unknown[]>): number | false {
  if (query.state.error) return 5000;
  return isTerminal(query.state.data?.status) ? false : JOB_POLL_MS;
}

export function useJob(id: number) {
  return useQuery({
    queryKey: keys.job(id),
    queryFn: () => api<Job>(`jobs/${id}/`),
    refetchInterval: pollWhileRunning,
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

export function useReport(id: number) {
  return useQuery({
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

export function useRegistrationTokens() {
  return useQuery({
    queryKey: keys.registrationTokens,
    queryFn: () => api<Paginated<RegistrationToken> | RegistrationToken[]>('agents/registration-tokens/'),
  });
}

export function useCreateRegistrationToken() {
  const client = useQueryClient();
  return useMutation({
    mutationFn: (name: string) =>
      api<RegistrationToken>('agents/registration-tokens/', { method: 'POST', body: { name } }),
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
      api<ApiToken>('tokens/', { method: 'POST', body }),
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
