/** Routes of the Kiln UI. */
import { QueryClient, QueryClientProvider } from '@tanstack/react-query';
import { createBrowserRouter, Navigate, RouterProvider, useParams, useRouteError, type RouteObject } from 'react-router';
import { ApiError } from './api/client';
import { ErrorMessage } from './components/common';
import { Layout } from './components/Layout';
import { AuthPage } from './pages/AuthPage';
import { DatasetsPage } from './pages/DatasetsPage';
import { DevicesPage } from './pages/DevicesPage';
import { JobPage } from './pages/JobPage';
import { JobsPage } from './pages/JobsPage';
import { MembersPage } from './pages/MembersPage';
import { ModelDetailPage } from './pages/ModelDetailPage';
import { ModelsPage } from './pages/ModelsPage';
import { NewDeploymentPage } from './pages/NewDeploymentPage';
import { PerformancePage } from './pages/PerformancePage';
import { ReportPage } from './pages/report/ReportPage';
import { TokensPage } from './pages/TokensPage';
import { ComparePage } from './pages/compare/ComparePage';

function RouteError() {
  const error = useRouteError();
  return (
    <main className="center-page">
      <ErrorMessage error={error instanceof Error ? error : 'Something went wrong on this page.'} title="Something went wrong." />
      <a href="/models">Back to models</a>
    </main>
  );
}

function NotFound() {
  return (
    <div className="empty-state">
      <h1>Page not found</h1>
      <a href="/models">Go to your models</a>
    </div>
  );
}

/** A deployment is a job: `/deployments/5` (what the navigation says) opens `/jobs/5`, and its report likewise. */
function DeploymentRedirect({ report = false }: { report?: boolean }) {
  const { jobId } = useParams();
  return <Navigate to={`/jobs/${jobId}${report ? '/report' : ''}`} replace />;
}

export const routes: RouteObject[] = [
  { path: '/login', element: <AuthPage mode="login" /> },
  { path: '/signup', element: <AuthPage mode="signup" /> },
  {
    path: '/',
    element: <Layout />,
    errorElement: <RouteError />,
    children: [
      { index: true, element: <Navigate to="/models" replace /> },
      { path: 'models', element: <ModelsPage /> },
      { path: 'models/:modelId', element: <ModelDetailPage /> },
      { path: 'datasets', element: <DatasetsPage /> },
      { path: 'deployments', element: <JobsPage /> },
      { path: 'deployments/new', element: <NewDeploymentPage /> },
      { path: 'deployments/:jobId', element: <DeploymentRedirect /> },
      { path: 'deployments/:jobId/report', element: <DeploymentRedirect report /> },
      { path: 'jobs', element: <Navigate to="/deployments" replace /> },
      { path: 'jobs/:jobId', element: <JobPage /> },
      { path: 'jobs/:jobId/report', element: <ReportPage /> },
      { path: 'performance', element: <PerformancePage /> },
      { path: 'compare', element: <ComparePage /> },
      { path: 'devices', element: <DevicesPage /> },
      { path: 'settings/tokens', element: <TokensPage /> },
      { path: 'members', element: <MembersPage /> },
      { path: '*', element: <NotFound /> },
    ],
  },
];

export function makeQueryClient(): QueryClient {
  const client: QueryClient = new QueryClient({
    defaultOptions: {
      queries: {
        staleTime: 2000,
        refetchOnWindowFocus: true,
        // A 4xx is an answer; only network trouble and 5xx deserve another try.
        retry: (count, error) => count < 2 && (!(error instanceof ApiError) || error.status === 0 || error.status >= 500),
      },
    },
  });
  // A session that expires mid-use sends the user back to sign in instead of showing errors everywhere.
  client.getQueryCache().subscribe((event) => {
    const error = event.query.state.error;
    if (event.type === 'updated' && error instanceof ApiError && error.status === 401 && event.query.queryKey[0] !== 'me') {
      client.setQueryData(['me'], null);
    }
  });
  client.getMutationCache().subscribe((event) => {
    const error = event.mutation?.state.error;
    if (error instanceof ApiError && error.status === 401) client.setQueryData(['me'], null);
  });
  return client;
}

const router = createBrowserRouter(routes);

export function App({ client }: { client: QueryClient }) {
  return (
    <QueryClientProvider client={client}>
      <RouterProvider router={router} />
    </QueryClientProvider>
  );
}
