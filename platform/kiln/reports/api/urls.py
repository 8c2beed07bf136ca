from django.urls import path

from . import views

urlpatterns = [
    path("jobs/<id:pk>/report/", views.JobReportView.as_view(), name="job-report"),
    path("performance/", views.PerformanceListView.as_view(), name="performance"),
    path("performance/estimate/", views.PerformanceEstimateView.as_view(), name="performance-estimate"),
    path("packages/signing-key/", views.PackageSigningKeyView.as_view(), name="package-signing-key"),
    path("packages/key/", views.PackageKeyView.as_view(), name="package-key"),
]
