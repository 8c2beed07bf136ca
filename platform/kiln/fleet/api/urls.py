from django.urls import path

from . import views

urlpatterns = [
    path("agents/", views.AgentListView.as_view(), name="agents"),
    path("agents/setup/", views.AgentSetupView.as_view(), name="agent-setup"),
    path("agents/registration-tokens/", views.RegistrationTokenListView.as_view(), name="registration-tokens"),
    path("agents/registration-tokens/<id:pk>/revoke/", views.RegistrationTokenRevokeView.as_view(), name="registration-token-revoke"),
    path("agents/<id:pk>/", views.AgentDetailView.as_view(), name="agent-detail"),
    path("agents/<id:pk>/revoke/", views.AgentRevokeView.as_view(), name="agent-revoke"),
]
