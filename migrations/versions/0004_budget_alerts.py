"""budget alerts: webhooks, once-guard, delivery outbox and log

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29 13:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('alert_deliveries',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('tenant_id', sa.String(length=36), nullable=False),
    sa.Column('event_type', sa.String(length=64), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('num_attempts', sa.Integer(), nullable=False),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('claimed_until', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_status_code', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_alert_deliveries_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_alert_deliveries'))
    )
    with op.batch_alter_table('alert_deliveries', schema=None) as batch_op:
        batch_op.create_index('ix_alert_deliveries_due', ['status', 'next_attempt_at'], unique=False)
        batch_op.create_index('ix_alert_deliveries_tenant_time', ['tenant_id', 'created_at'], unique=False)

    op.create_table('alert_firings',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('tenant_id', sa.String(length=36), nullable=False),
    sa.Column('subject', sa.String(length=40), nullable=False),
    sa.Column('budget', sa.String(length=64), nullable=False),
    sa.Column('period', sa.String(length=16), nullable=False),
    sa.Column('threshold', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_alert_firings_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_alert_firings')),
    sa.UniqueConstraint('subject', 'budget', 'period', 'threshold', name=op.f('uq_alert_firings_subject'))
    )
    with op.batch_alter_table('alert_firings', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_alert_firings_tenant_id'), ['tenant_id'], unique=False)

    op.create_table('alert_webhooks',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('tenant_id', sa.String(length=36), nullable=False),
    sa.Column('url', sa.String(length=2048), nullable=False),
    sa.Column('secret_sealed', sa.String(length=256), nullable=False),
    sa.Column('thresholds', sa.JSON(), nullable=False),
    sa.Column('events', sa.JSON(), nullable=False),
    sa.Column('enabled', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_alert_webhooks_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_alert_webhooks')),
    sa.UniqueConstraint('tenant_id', name=op.f('uq_alert_webhooks_tenant_id'))
    )
    op.create_table('alert_delivery_attempts',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('delivery_id', sa.String(length=36), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('status_code', sa.Integer(), nullable=True),
    sa.Column('error', sa.String(length=200), nullable=True),
    sa.ForeignKeyConstraint(['delivery_id'], ['alert_deliveries.id'], name=op.f('fk_alert_delivery_attempts_delivery_id_alert_deliveries'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_alert_delivery_attempts')),
    sa.UniqueConstraint('delivery_id', 'attempt', name=op.f('uq_alert_delivery_attempts_delivery_id'))
    )


def downgrade() -> None:
    op.drop_table('alert_delivery_attempts')
    op.drop_table('alert_webhooks')
    with op.batch_alter_table('alert_firings', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_alert_firings_tenant_id'))

    op.drop_table('alert_firings')
    with op.batch_alter_table('alert_deliveries', schema=None) as batch_op:
        batch_op.drop_index('ix_alert_deliveries_tenant_time')
        batch_op.drop_index('ix_alert_deliveries_due')

    op.drop_table('alert_deliveries')
