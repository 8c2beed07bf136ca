from django.urls import path

from . import views

urlpatterns = [
    path("jobs/<int:pk>/report/", views.JobReportView.as_view(), name="job-report"),
    path("performance/", views.PerformanceListView.as_view(), name="performance"),
    path("packages/signing-key/", views.PackageSigningKeyView.as_view(), name="package-signing-key"),
    path("packages/key/", views.PackageKeyView.as_view(), name="package-key"),
    path("performance/estimate/", views.PerformanceEstimateView.as_view(), name="performance-estimate"),
]
